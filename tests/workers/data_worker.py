"""Multi-rank checks of DistributedDataContainer / DistributedSampler (run at 1, 2 and 4 ranks).

Every rank builds its shard from Init's rank and world size; allreduce_ of per-index count
tensors then shows what all ranks hold together, which must match closed forms.
"""

import functools
import inspect
import itertools
import warnings

import torch
from harness import raises, run_cases  # also puts the repository on sys.path
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, Subset, TensorDataset

import fluxmpi_py as fm
from fluxmpi_py._core import C

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
        counts = (
            torch.bincount(d.indices(), minlength=n) if n else torch.zeros(0, dtype=torch.int64)
        )
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
        for make in (
            functools.partial(fm.DistributedDataContainer, list(range(10)), **kwargs),
            functools.partial(fm.DistributedSampler, 10, **kwargs),
        ):
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


def _shard_of_order(n, seed, epoch, start=0):
    """This rank's indices (pad mode) for the epoch, computed from the order itself."""
    p, r = fm.total_workers(), fm.local_rank()
    per = -(-n // p)
    o = _order(n, True, seed, epoch)
    return o[torch.arange(r * per, (r + 1) * per) % n][start:]


def case_persistent_workers_follow_set_epoch():
    n, seed = 37, 4
    d = fm.DistributedDataContainer(TensorDataset(torch.arange(n)), shuffle=True, seed=seed)
    batched = DataLoader(d, batch_size=3, num_workers=2, persistent_workers=True)
    single = DataLoader(d, batch_size=None, num_workers=2, persistent_workers=True)  # __getitem__
    seen = []
    for epoch in range(3):
        d.set_epoch(epoch)
        want = _shard_of_order(n, seed, epoch)
        assert torch.equal(torch.cat([b[0] for b in batched]), want), (epoch, fm.local_rank())
        assert torch.equal(torch.stack([x[0] for x in single]), want), (epoch, fm.local_rank())
        seen.append(want.tolist())
    assert seen[0] != seen[1] != seen[2]  # the test can tell epochs apart
    # a resumed position and seed reach the same workers too
    d.load_state_dict({"epoch": 7, "seed": 11, "position": 5})
    assert torch.equal(torch.cat([b[0] for b in batched]), _shard_of_order(n, 11, 7, start=5))


def _full_dataset_warnings(make):
    """The FullDatasetWarnings of fm.check_dataloader on the loader ``make`` builds; building
    and iterating it warn nothing (torch's DataLoader is not patched)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = make()
        for _ in loader:
            pass
        assert not caught, [str(w.message) for w in caught]
        fm.check_dataloader(loader)
    return [w for w in caught if issubclass(w.category, fm.FullDatasetWarning)]


def case_double_sharding_is_refused():
    p, r = fm.total_workers(), fm.local_rank()
    data = TensorDataset(torch.arange(40))
    d = fm.DistributedDataContainer(data)
    check = fm.check_dataloader
    makers = {  # ours refuses when it is built; a DataLoader of torch's parts in the check
        "ours": lambda: fm.DistributedSampler(d),
        "torch's": lambda: check(
            DataLoader(
                d,
                sampler=torch.utils.data.DistributedSampler(d, num_replicas=p, rank=r),
                batch_size=4,
            )
        ),
        "torch's in a batch_sampler": lambda: check(
            DataLoader(
                d,
                batch_sampler=BatchSampler(
                    torch.utils.data.DistributedSampler(d, num_replicas=p, rank=r), 4, False
                ),
            )
        ),
        "ours over a Subset of the container": lambda: check(
            DataLoader(Subset(d, range(3)), sampler=fm.DistributedSampler(3), batch_size=2)
        ),
    }
    for make in makers.values():
        if p == 1:
            make()  # one rank: the container is the whole data, nothing is sharded twice
            continue
        raises(
            TypeError,
            make,
            "DistributedDataContainer",
            f"rank {r}",
            f"1/{p * p}",
            "without a distributed sampler",
        )


def case_full_dataset_warns():
    p, r = fm.total_workers(), fm.local_rank()
    data = TensorDataset(torch.arange(40))
    sampler = fm.DistributedSampler(data)  # created, but not passed to the DataLoader
    assert len(sampler) == -(-40 // p)
    cases = {
        "default": lambda: DataLoader(data, batch_size=8),
        "shuffle": lambda: DataLoader(data, batch_size=8, shuffle=True),
        "no batching": lambda: DataLoader(data, batch_size=None),
        "batch_sampler": lambda: DataLoader(
            data, batch_sampler=BatchSampler(torch.utils.data.SequentialSampler(data), 8, False)
        ),
        "one replica": lambda: DataLoader(
            data, sampler=fm.DistributedSampler(data, num_replicas=1, rank=0)
        ),
    }

    class MyLoader(DataLoader):
        def __init__(self, dataset, **kw):
            super().__init__(dataset, **kw)

    cases["subclass"] = lambda: MyLoader(data, batch_size=8)
    for what, make in cases.items():
        got = _full_dataset_warnings(make)
        if p == 1:
            assert not got, (what, [str(w.message) for w in got])
            continue
        assert len(got) == 1, (what, [str(w.message) for w in got])
        msg = str(got[0].message)
        for needle in (
            "TensorDataset",
            "40 samples",
            f"rank {r} of {p}",
            "DistributedDataContainer",
            "DistributedSampler",
            "FullDatasetWarning",
        ):
            assert needle in msg, (what, needle, msg)
        assert got[0].filename == __file__, (what, got[0].filename)  # points at the user's line
    # silenced the documented way
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=fm.FullDatasetWarning)
        fm.check_dataloader(DataLoader(data, batch_size=8))
    assert not caught, [str(w.message) for w in caught]


class _Stream(IterableDataset):
    def __iter__(self):
        return iter(range(5))


def case_sharded_loaders_do_not_warn():
    p, r = fm.total_workers(), fm.local_rank()
    data = TensorDataset(torch.arange(40))
    d = fm.DistributedDataContainer(data, shuffle=True)
    cases = {
        "container": lambda: DataLoader(d, batch_size=8, shuffle=True),
        "Subset of a container": lambda: DataLoader(Subset(d, range(3)), batch_size=2),
        "our sampler": lambda: DataLoader(data, batch_size=8, sampler=fm.DistributedSampler(data)),
        "torch's sampler": lambda: DataLoader(
            data,
            batch_size=8,
            sampler=torch.utils.data.DistributedSampler(data, num_replicas=p, rank=r),
        ),
        "batch_sampler over ours": lambda: DataLoader(
            data, batch_sampler=BatchSampler(fm.DistributedSampler(data), 8, False)
        ),
        "IterableDataset": lambda: DataLoader(_Stream(), batch_size=2),
        "custom sampler": lambda: DataLoader(data, sampler=list(range(r, 40, p))),
    }
    for what, make in cases.items():
        got = _full_dataset_warnings(make)
        assert not got, (what, [str(w.message) for w in got])


def case_dataloader_is_torchs_own():
    """Init leaves torch's DataLoader as it is: no wrapper, nothing set on the class."""
    fm.Init()
    init = DataLoader.__init__
    assert not hasattr(init, "__wrapped__"), init
    assert init.__module__ == "torch.utils.data.dataloader", init.__module__
    assert "batch_sampler" in inspect.signature(DataLoader).parameters


run_cases(globals())
