"""Sub-groups on the "fluxmpi" torch.distributed backend: new_group over a subset runs on an MPI
sub-communicator (collectives against closed forms over the members, NON_GROUP_MEMBER
elsewhere, DDP on a subgroup), a 2-D DeviceMesh (collectives over each dimension's groups,
HSDP with fully_shard against one process), and the multi-device string
"cpu:fluxmpi,cuda:gloo" sending CPU tensors to fluxmpi.

Run by tests/test_c10d.py at 1, 2, 3 and 4 ranks.
"""

import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from c10d_ddp_worker import (  # noqa: E402
    fully_shard_matches_one_process,
    gloo_order,
    noisy,
    same_params,
    train_ddp,
)
from c10d_worker import check_equal, rank, setup, world  # noqa: E402
from harness import raises, run_cases  # noqa: E402


def subset():
    """Every rank but rank 1 (rank 0 alone at 1 and 2 ranks): not the world, not a block."""
    return [r for r in range(world()) if r != 1] if world() > 2 else [0]


def case_subgroup_collectives_against_closed_forms():
    members = subset()
    g = dist.new_group(members)
    tail = dist.new_group(list(range(world() - 2, world())) if world() > 1 else [0])
    if rank() not in members:
        assert g == dist.GroupMember.NON_GROUP_MEMBER, g
    else:
        k, me = len(members), members.index(rank())
        assert (dist.get_rank(g), dist.get_world_size(g), dist.get_backend(g)) == (
            me,
            k,
            "fluxmpi",
        )
        total = float(sum(m + 1 for m in members))
        t = torch.tensor([1.0, 2.0]) * (rank() + 1)
        dist.all_reduce(t, group=g)
        check_equal(t, torch.tensor([1.0, 2.0]) * total, "all_reduce")
        for src in members:
            t = torch.full((3,), float(rank()))
            dist.broadcast(t, src=src, group=g)  # src is a world rank; torch passes its place
            check_equal(t, torch.full((3,), float(src)), f"broadcast from {src}")
        outs = [torch.empty(2) for _ in members]
        dist.all_gather(outs, torch.full((2,), float(rank())), group=g)
        check_equal(torch.stack(outs), torch.tensor(members, dtype=torch.float)[:, None].expand(k, 2),
                    "all_gather")  # fmt: skip
        out = torch.empty(2)
        dist.reduce_scatter_tensor(out, torch.arange(2.0 * k) * (rank() + 1), group=g)
        check_equal(out, torch.tensor([2.0 * me, 2.0 * me + 1]) * total, "reduce_scatter_tensor")
        out = torch.empty(k, dtype=torch.long)
        dist.all_to_all_single(out, torch.arange(k) + 10 * rank(), group=g)
        check_equal(out, torch.tensor(members) * 10 + me, "all_to_all_single")
        if k > 1:  # a ring over the members: world ranks in, world ranks out
            nxt, prv = members[(me + 1) % k], members[(me - 1) % k]
            got = torch.empty(1, dtype=torch.long)
            reqs = [dist.isend(torch.tensor([rank()]), nxt, group=g),
                    dist.irecv(got, prv, group=g)]  # fmt: skip
            for q in reqs:
                q.wait()
            check_equal(got, torch.tensor([prv]), "send/recv on the group")
        dist.barrier(group=g)
    if rank() in range(world() - 2, world()):
        t = torch.ones(1)
        dist.all_reduce(t, group=tail)
        check_equal(t, torch.full((1,), float(min(world(), 2))), "the second group")
    t = torch.ones(1)
    dist.all_reduce(t)  # the world after both groups
    check_equal(t, torch.full((1,), float(world())), "the world")


def case_subgroup_disagreement_raises_on_its_members_only():
    members = subset()
    g = dist.new_group(members)
    if rank() in members and len(members) > 1:
        t = torch.ones(2 + (rank() == members[-1]))
        raises(RuntimeError, lambda: dist.all_reduce(t, group=g), "ranks disagree")
    t = torch.ones(1)
    dist.all_reduce(t)  # every rank is still in step
    check_equal(t, torch.full((1,), float(world())), "the world after the error")


def case_ddp_on_a_subgroup_equals_ddp_on_gloo():
    members = subset()
    g = dist.new_group(members)
    gloo_g = dist.new_group(members, backend="gloo")
    if rank() in members:
        same_params(train_ddp(g), train_ddp(gloo_g), "DDP(process_group=subgroup)")
        # in gloo's order, bit for bit also over 3 members (4 ranks), whose ranks in the
        # group are not their world ranks
        with gloo_order():
            for i, (a, b) in enumerate(zip(train_ddp(g), train_ddp(gloo_g))):
                assert torch.equal(a, b), f"parameter {i} differs: {(a - b).abs().max()}"
            x = noisy(300007, torch.float32, rank())
            want, got = x.clone(), x.clone()
            dist.all_reduce(want, group=gloo_g)
            dist.all_reduce(got, group=g)
            assert torch.equal(got, want), "all_reduce on the subgroup in gloo's order"


def mesh_shape():
    """(2, n/2) at even world sizes, else (n, 1): 2 x 2 at 4 ranks."""
    n = world()
    return (2, n // 2) if n % 2 == 0 else (n, 1)


def case_device_mesh_2d_collectives_per_dimension():
    from torch.distributed.device_mesh import init_device_mesh

    dp, tp = mesh_shape()
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    i, j = divmod(rank(), tp)  # this rank's coordinates
    groups = {
        "dp": [a * tp + j for a in range(dp)],  # same tp coordinate
        "tp": [i * tp + b for b in range(tp)],  # same dp coordinate
    }
    for name, ranks in groups.items():
        g = mesh.get_group(name)
        assert dist.get_process_group_ranks(g) == ranks, (name, dist.get_process_group_ranks(g))
        assert dist.get_backend(g) == "fluxmpi", dist.get_backend(g)
        t = torch.tensor([float(rank() + 1)])
        dist.all_reduce(t, group=g)
        check_equal(t, torch.tensor([float(sum(r + 1 for r in ranks))]), f"all_reduce on {name}")
        out = torch.empty(len(ranks), dtype=torch.long)
        dist.all_gather_into_tensor(out, torch.tensor([rank()]), group=g)
        check_equal(out, torch.tensor(ranks), f"all_gather_into_tensor on {name}")
        t = torch.tensor([rank()])
        dist.broadcast(t, src=ranks[-1], group=g)
        check_equal(t, torch.tensor([ranks[-1]]), f"broadcast on {name}")


def case_hsdp_on_a_2d_mesh_equals_single_process():
    from torch.distributed.device_mesh import init_device_mesh

    # replicate over dim 0, shard over dim 1
    mesh = init_device_mesh("cpu", mesh_shape(), mesh_dim_names=("replicate", "shard"))
    fully_shard_matches_one_process(mesh)


def case_mixed_device_string_sends_cpu_tensors_to_fluxmpi():
    """init_process_group("cpu:fluxmpi,cuda:gloo"): CPU collectives run on fluxmpi (its
    agreement check answers a mismatch), a subset group too. Restores the plain default.
    Both inits after the first take the fluxmpi:// rendezvous, a fresh store each: env://
    would bind MASTER_PORT again while the groups of earlier cases keep its store alive."""
    setup()
    dist.destroy_process_group()
    dist.init_process_group("cpu:fluxmpi,cuda:gloo", init_method="fluxmpi://")
    try:
        pg = dist.group.WORLD
        assert pg._get_backend(torch.device("cpu")).name() == "fluxmpi"
        assert pg._get_backend(torch.device("cuda")).name() == "gloo"
        t = torch.full((2,), float(rank() + 1))
        dist.all_reduce(t)
        n = world()
        check_equal(t, torch.full((2,), n * (n + 1) / 2), "all_reduce on the mixed group")
        if n > 1:  # gloo would not name the ranks that disagree
            bad = torch.ones(2 + (rank() == 1))
            raises(RuntimeError, lambda: dist.all_reduce(bad), "ranks disagree")
        members = subset()
        g = dist.new_group(members)
        if rank() in members:
            assert g._get_backend(torch.device("cpu")).name() == "fluxmpi"
            t = torch.ones(1)
            dist.all_reduce(t, group=g)
            check_equal(t, torch.full((1,), float(len(members))), "all_reduce on a subgroup")
    finally:
        dist.destroy_process_group()
        dist.init_process_group("fluxmpi", init_method="fluxmpi://")


if __name__ == "__main__":
    run_cases(globals())
    dist.destroy_process_group()
