"""Group forms on the "fluxmpi" torch.distributed backend beyond new_group over every rank:
use_local_synchronization=True (the members make the group alone, MPI_Comm_create_group),
sort_ranks=False (ranks in the group follow the list), and split_group (torch's own, which
refuses a CPU parent). Collectives on them against closed forms, non-members running world collectives
meanwhile, and each bad input raising on every rank that takes part.

Run by tests/test_c10d.py at 1, 2 and 3 ranks.
"""

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from c10d_worker import check_equal, rank, world  # noqa: E402
from harness import raises, run_cases  # noqa: E402


def world_sum_is_intact(what):
    """A world all_reduce after `what`: every rank is still in step."""
    t = torch.full((1,), float(rank() + 1))
    dist.all_reduce(t)
    n = world()
    check_equal(t, torch.full((1,), n * (n + 1) / 2), f"the world after {what}")


def check_group(g, order, what):
    """On a member of g, made from the world ranks `order` (in group order): its ranks and
    collectives against closed forms, results in the order of the list."""
    k, me = len(order), order.index(rank())
    assert dist.get_process_group_ranks(g) == order, (what, dist.get_process_group_ranks(g))
    assert (dist.get_rank(g), dist.get_world_size(g)) == (me, k), (what, dist.get_rank(g))
    t = torch.tensor([1.0, 2.0]) * (rank() + 1)
    dist.all_reduce(t, group=g)
    check_equal(t, torch.tensor([1.0, 2.0]) * sum(r + 1 for r in order), f"all_reduce on {what}")
    outs = [torch.empty(1, dtype=torch.long) for _ in order]
    dist.all_gather(outs, torch.tensor([rank()]), group=g)
    check_equal(torch.cat(outs), torch.tensor(order), f"all_gather on {what}")
    for src in order:  # a world rank; torch passes its place in the group
        t = torch.full((2,), float(rank()))
        dist.broadcast(t, src=src, group=g)
        check_equal(t, torch.full((2,), float(src)), f"broadcast from {src} on {what}")
    out = torch.empty(k, dtype=torch.long)
    dist.all_to_all_single(out, torch.arange(k) + 10 * rank(), group=g)
    check_equal(out, torch.tensor(order) * 10 + me, f"all_to_all_single on {what}")
    if k > 1:  # a ring in the list's order
        nxt, prv = order[(me + 1) % k], order[(me - 1) % k]
        got = torch.empty(1, dtype=torch.long)
        reqs = [dist.isend(torch.tensor([rank()]), nxt, group=g), dist.irecv(got, prv, group=g)]
        for q in reqs:
            q.wait()
        check_equal(got, torch.tensor([prv]), f"send/recv on {what}")


def members():
    """Every rank but rank 1 at 3 ranks (not a block), else every rank."""
    return [r for r in range(world()) if r != 1] if world() > 2 else list(range(world()))


def case_local_group_is_made_by_its_members_alone():
    ranks = members()
    if rank() in ranks:
        g = dist.new_group(ranks, use_local_synchronization=True)
        check_group(g, ranks, f"the local group {ranks}")
    else:  # never calls with it: a world collective waits for the members' return
        # torch's answer to a non-member: None up to 2.13, its NON_GROUP_MEMBER from 2.14
        g = dist.new_group(ranks, use_local_synchronization=True)
        assert g is None or g == dist.GroupMember.NON_GROUP_MEMBER, g
    world_sum_is_intact("a local group")
    # each rank a group of its own, nothing asked of the others; then a group every rank makes
    mine = dist.new_group([rank()], use_local_synchronization=True)
    check_group(mine, [rank()], "a group of one")
    tail = list(range(world() - 2, world())) if world() > 1 else [0]
    g = dist.new_group(tail)
    if rank() in tail:
        check_group(g, tail, f"the group {tail} after the local ones")
    world_sum_is_intact("groups of one")


def case_unsorted_ranks_give_group_ranks_in_list_order():
    backwards = list(range(world()))[::-1]
    g = dist.new_group(backwards, sort_ranks=False)  # every rank calls
    check_group(g, backwards, f"new_group({backwards}, sort_ranks=False)")
    part = members()[::-1]
    g = dist.new_group(part, sort_ranks=False)
    if rank() in part:
        check_group(g, part, f"new_group({part}, sort_ranks=False)")
        local = dist.new_group(part, sort_ranks=False, use_local_synchronization=True)
        check_group(local, part, f"the local group {part}, sort_ranks=False")
    world_sum_is_intact("unsorted groups")


def case_split_group_is_torchs_and_refuses_a_cpu_fluxmpi_parent():
    """split_group is torch's own (fluxmpi_py patches nothing): it splits an accelerator
    backend's communicator (NCCL's), so over a CPU fluxmpi group it raises torch's error on
    every rank, and nothing is left half made."""
    raises(RuntimeError, lambda: dist.split_group(split_ranks=[list(range(world()))]), "split")
    world_sum_is_intact("a refused split_group")


def case_members_giving_different_lists_raise_on_every_member():
    if world() < 2:
        return
    if world() == 2:  # the same ranks in two orders, order kept
        order = [[0, 1], [1, 0]][rank()]
        raises(RuntimeError,
               lambda: dist.new_group(order, sort_ranks=False, use_local_synchronization=True),
               "different rank lists", "rank 0: [0, 1]", "rank 1: [1, 0]")  # fmt: skip
    else:  # rank 0 names everyone, rank 1 and rank 2 leave each other out
        lists = [[0, 1, 2], [0, 1], [0, 2]]
        raises(RuntimeError,
               lambda: dist.new_group(lists[rank()], use_local_synchronization=True),
               "different rank lists", "rank 1: [0, 1]", "rank 2: [0, 2]")  # fmt: skip
    world_sum_is_intact("local lists that differ")
    # the same over every rank: the order differs on rank 0
    order = list(range(world())) if rank() == 0 else list(range(world()))[::-1]
    raises(RuntimeError, lambda: dist.new_group(order, sort_ranks=False),
           "different rank lists", "in the same order (sort_ranks=False)")  # fmt: skip
    # an identical list that names a rank twice: torch's own ValueError on each member
    if rank() in (0, 1):
        raises(ValueError, lambda: dist.new_group([0, 1, 1], use_local_synchronization=True),
               "duplicate")  # fmt: skip
    world_sum_is_intact("lists that differ")


def case_zz_a_rank_that_never_joins_ends_in_a_timeout_error():
    """Last: the message rank 0 left for rank 1 stays unread."""
    if world() < 2:
        return
    if rank() == 0:  # rank 1 never calls with this group
        raises(RuntimeError,
               lambda: dist.new_group([0, 1], use_local_synchronization=True,
                                      timeout=timedelta(seconds=2)),
               "ranks [1] did not join within 2")  # fmt: skip
    world_sum_is_intact("a rank that never joined")


if __name__ == "__main__":
    run_cases(globals())
    dist.destroy_process_group()
