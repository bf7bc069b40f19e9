"""Multi-rank checks of DistributedDataContainer / DistributedSampler (run at 1, 2 and 4 ranks).

Every rank builds its shard from Init's rank and world size; allreduce_ of per-index count
tensors then shows what all ranks hold together, which must match closed forms.
"""
import functools
import itertools

import torch
from harness import run_cases  # also puts the repository on sys.path

import fluxmpi_py as fm
from fluxmpi_py._loader import C

MODES = {"pad": dict(pad=True), "drop_last": dict(drop_last=True), "even": dict(pad=False)}
SIZES = [0, 1, 3, 4, 7, 10, 33, 257]


def _order(n, shuffle, seed, epoch):
    if not shuffle:
        return torch.arange(n)
    return C.shard_indices(n, 1, 0, "even", True, seed, epoch, 0, n)


def _allreduce(values, op):
    return fm.allreduce_(torch.tensor(values, dtype=torch.int64), op=op).tolist()


def case_rank_and_size_come_from_init():
    d = fm.DistributedDataContainer(list(range(10)))
    s = fm.DistributedSampler(10)
    assert (d.rank, d.world_size) == (fm.local_rank(), fm.total_workers())
    assert (s.rank, s.num_replicas) == (fm.local_rank(), fm.total_workers())


def case_all_ranks_together_cover_the_data():
    p = fm.total_workers()
    for n, (mode, kw), shuffle in itertools.product(SIZES, MODES.items(), (False, True)):
        d = fm.DistributedDataContainer(list(range(n)), shuffle=shuffle, seed=17, **kw)
        d.set_epoch(3)
        counts = torch.bincount(d.indices(), minlength=n) if n else torch.zeros(0, dtype=torch.int64)
        fm.allreduce_(counts, op="sum")
        o = _order(n, shuffle, 17, 3)
        want = torch.zeros(n, dtype=torch.int64)
        if mode == "even":
            want += 1
        elif mode == "drop_last":
            want[o[: p * (n // p)]] = 1
        elif n:
            # ceil(n/p) per rank wraps over the order: the first (p*L) mod n get one more
            q, extra = divmod(p * -(-n // p), n)
            want += q
            want[o[:extra]] += 1
        assert torch.equal(counts, want), (n, mode, shuffle, counts, want)
        lo, hi = _allreduce([len(d)], "min")[0], _allreduce([len(d)], "max")[0]
        if mode == "even":
            assert hi - lo <= 1 and (n < p or lo >= 1), (n, lo, hi)
        else:
            assert lo == hi, (n, mode, lo, hi)  # equal step counts: per-step collectives never hang


def case_every_rank_derives_the_same_permutation():
    for n, seed, epoch in ((1000, 0, 0), (4097, 123, 9), (1 << 20, 2**64 - 1, 5)):
        perm = _order(n, True, seed, epoch)
        digest = int((perm * torch.arange(1, n + 1)).sum() % (1 << 61))
        assert _allreduce([digest], "min") == _allreduce([digest], "max")
        # and this rank's sampler walks exactly its slice of that permutation
        s = fm.DistributedSampler(n, seed=seed)
        s.set_epoch(epoch)
        length = -(-n // fm.total_workers())
        start = fm.local_rank() * length
        want = perm[(torch.arange(start, start + length)) % n]
        assert torch.equal(torch.tensor(list(s)), want)


def case_sampler_matches_container():
    for kw in MODES.values():
        d = fm.DistributedDataContainer(list(range(101)), shuffle=True, seed=5, **kw)
        s = fm.DistributedSampler(101, seed=5, **kw)
        d.set_epoch(2)
        s.set_epoch(2)
        assert list(s) == list(d) == d.indices().tolist()


def case_resume_from_rank0_state():
    # The usual pattern: rank 0 checkpoints, every rank loads rank 0's state.
    n, k = 203, 7
    s = fm.DistributedSampler(n, seed=9)
    s.set_epoch(1)
    want = list(s)
    it = iter(s)
    head = [next(it) for _ in range(k)]
    state = s.state_dict()
    flat = torch.tensor([state["epoch"], state["seed"], state["position"]])
    fm.bcast_(flat, root_rank=0)
    epoch, seed, position = flat.tolist()
    r = fm.DistributedSampler(n, seed=0)
    r.load_state_dict({"epoch": epoch, "seed": seed, "position": position})
    assert head + list(r) == want


def case_ranks_that_disagree_raise_everywhere():
    if fm.total_workers() == 1:
        return
    for kwargs in ({"seed": fm.local_rank()}, {"shuffle": fm.local_rank() == 0}):
        for make in (functools.partial(fm.DistributedDataContainer, list(range(10)), **kwargs),
                     functools.partial(fm.DistributedSampler, 10, **kwargs)):
            try:
                make()
            except ValueError as e:
                assert "ranks disagree" in str(e) and next(iter(kwargs)) in str(e), str(e)
            else:
                raise AssertionError(f"rank {fm.local_rank()}: no error for {kwargs}")
    # different lengths are caught too
    try:
        fm.DistributedDataContainer(list(range(10 + fm.local_rank())))
    except ValueError as e:
        assert "n ranges over [10, " in str(e), str(e)
    else:
        raise AssertionError("no error for different lengths")


run_cases(globals())
