"""DistributedDataContainer and DistributedSampler: shard contents, coverage, shuffle quality,
resume, pickling and DataLoader use in one process (explicit rank/world_size), plus the
multi-rank worker at 1, 2 and 4 ranks."""

import collections
import copy
import doctest
import itertools
import math
import os
import pickle
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import worker_params  # noqa: E402

import fluxmpi_py as fm  # noqa: E402
from fluxmpi_py._core import C  # noqa: E402
from fluxmpi_py._util import rng  # noqa: E402
from fluxmpi_py._util.shared_view import SharedInts  # noqa: E402
from fluxmpi_py.data._global_batch import GlobalBatches  # noqa: E402

MODES = {"pad": dict(pad=True), "drop_last": dict(drop_last=True), "even": dict(pad=False)}
SIZES = [
    (0, 1),
    (0, 3),
    (1, 1),
    (1, 4),
    (2, 4),
    (3, 4),
    (5, 4),
    (7, 3),
    (7, 2),
    (8, 4),
    (10, 3),
    (16, 5),
    (33, 7),
    (100, 8),
]


# --- plain-Python reference ---------------------------------------------------------------------
def ref_positions(n, p, r, mode):
    """Positions (in the epoch's order) that rank r of p holds, built the long way."""
    if mode == "pad":
        per = -(-n // p)
        padded = []
        while len(padded) < p * per:  # append whole copies of the order, then cut
            padded += list(range(n))
        return padded[: p * per][r * per : (r + 1) * per]
    if mode == "drop_last":
        per = n // p
        return list(range(n))[: p * per][r * per : (r + 1) * per]
    return [int(v) for v in np.array_split(np.arange(n), p)[r]]  # first n % p ranks one longer


def order(n, shuffle, seed=0, epoch=0):
    """The epoch's order of all n indices (the permutation alone, one rank of one)."""
    if not shuffle:
        return list(range(n))
    return C.shard_indices(n, 1, 0, "even", True, seed, epoch, 0, n).tolist()


def shard(n, p, r, mode, shuffle=False, seed=0, epoch=0):
    d = fm.DistributedDataContainer(
        list(range(n)), rank=r, world_size=p, shuffle=shuffle, seed=seed, **MODES[mode]
    )
    d.set_epoch(epoch)
    return [d[i] for i in range(len(d))]


# --- exact contents -----------------------------------------------------------------------------
def test_literal_shards():
    # n=7 over 3 ranks; n=2 over 4 ranks (n < p)
    assert [shard(7, 3, r, "pad") for r in range(3)] == [[0, 1, 2], [3, 4, 5], [6, 0, 1]]
    assert [shard(7, 3, r, "drop_last") for r in range(3)] == [[0, 1], [2, 3], [4, 5]]
    assert [shard(7, 3, r, "even") for r in range(3)] == [[0, 1, 2], [3, 4], [5, 6]]
    assert [shard(2, 4, r, "pad") for r in range(4)] == [[0], [1], [0], [1]]
    assert [shard(2, 4, r, "drop_last") for r in range(4)] == [[], [], [], []]
    assert [shard(2, 4, r, "even") for r in range(4)] == [[0], [1], [], []]
    assert [shard(0, 2, r, m) for r in range(2) for m in MODES] == [[]] * 6


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("shuffle", [False, True])
def test_shards_match_reference(mode, shuffle):
    for n, p in SIZES:
        for seed, epoch in ((0, 0), (5, 3)):
            o = order(n, shuffle, seed, epoch)
            for r in range(p):
                want = [o[q] for q in ref_positions(n, p, r, mode)]
                assert shard(n, p, r, mode, shuffle, seed, epoch) == want, (
                    n,
                    p,
                    r,
                    mode,
                    seed,
                    epoch,
                )
                s = fm.DistributedSampler(
                    n, num_replicas=p, rank=r, shuffle=shuffle, seed=seed, **MODES[mode]
                )
                s.set_epoch(epoch)
                assert list(s) == want and len(s) == len(want)


def test_container_over_dataset_types():
    x = torch.arange(20.0).reshape(10, 2)
    for data in (
        torch.utils.data.TensorDataset(x, torch.arange(10)),
        x,
        x.numpy(),
        list(range(10)),
        range(10),
    ):
        d = fm.DistributedDataContainer(data, rank=1, world_size=3)
        assert len(d) == 4
        got = d[0]
        want = data[4]
        if isinstance(want, tuple):
            assert all(torch.equal(a, b) for a, b in zip(got, want))
        else:
            assert np.array_equal(np.asarray(got), np.asarray(want))
        if isinstance(data, (list, range)):
            assert d[-1] == data[7] and [d[i] for i in range(4)] == [4, 5, 6, 7]
    d = fm.DistributedDataContainer(list("abcdefg"), rank=1, world_size=2)
    assert list(d) == ["e", "f", "g", "a"] and d.__getitems__([3, 0]) == ["a", "e"]


# --- coverage -----------------------------------------------------------------------------------
@pytest.mark.parametrize("shuffle", [False, True])
def test_union_and_multiset(shuffle):
    for n, p in SIZES + [(1000, 6), (997, 16)]:
        o = order(n, shuffle, 11, 2)
        per_rank = {m: [shard(n, p, r, m, shuffle, 11, 2) for r in range(p)] for m in MODES}
        # even: every sample exactly once, sizes differ by at most one, nobody empty if n >= p
        even = per_rank["even"]
        assert sorted(i for s in even for i in s) == list(range(n))
        sizes = [len(s) for s in even]
        assert max(sizes) - min(sizes) <= 1 and (n < p or min(sizes) >= 1)
        # pad: ceil(n/p) each; the total wraps over the order, so the first (p*L) mod n
        # indices of the order appear once more than the rest
        pad = per_rank["pad"]
        per = -(-n // p)
        assert all(len(s) == per for s in pad)
        counts = collections.Counter(i for s in pad for i in s)
        if n:
            q, extra = divmod(p * per, n)
            assert all(counts[o[k]] == q + (k < extra) for k in range(n))
        # drop_last: floor(n/p) each, no index twice, exactly the first p*floor(n/p) of the order
        drop = per_rank["drop_last"]
        assert all(len(s) == n // p for s in drop)
        flat = [i for s in drop for i in s]
        assert sorted(flat) == sorted(o[: p * (n // p)])


# --- the permutation ----------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 10, 17, 64, 65, 1000, 4097, 123_457, 1 << 20])
def test_permutation_is_bijection(n):
    for seed, epoch in ((0, 0), (1, 0), (0, 1), (2**64 - 1, 2**64 - 1)):
        p = C.shard_indices(n, 1, 0, "even", True, seed, epoch, 0, n)
        assert torch.equal(p.sort().values, torch.arange(n))
        assert torch.equal(C.permutation_inverse(n, seed, epoch, p), torch.arange(n))
        # random access agrees with the batched fill
        for q in {0, n // 2, n - 1}:
            assert C.shard_index(n, 1, 0, "even", True, seed, epoch, q) == p[q].item()


def test_permutation_huge_n_sampled():
    n = (1 << 40) + 7
    first = 1 << 39
    p = C.shard_indices(n, 1, 0, "even", True, 3, 4, first, 20_000)
    assert p.min().item() >= 0 and p.max().item() < n and p.unique().numel() == 20_000
    assert torch.equal(C.permutation_inverse(n, 3, 4, p), torch.arange(first, first + 20_000))
    assert len(fm.DistributedSampler(n, num_replicas=3, rank=2)) == -(-n // 3)


def test_permutation_depends_on_seed_and_epoch_only():
    base = order(1000, True, 7, 2)
    assert base == order(1000, True, 7, 2)
    assert base != order(1000, True, 7, 3) and base != order(1000, True, 8, 2)
    assert base != list(range(1000))


def _chi2_threshold(dof, z=4.75):
    # Wilson-Hilferty upper quantile of chi-square(dof); z = 4.75 is a one-sided p of ~1e-6,
    # so a correct permutation with these fixed seeds passes and a biased one cannot hide.
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def _chi2(counts):
    counts = np.asarray(counts, dtype=np.float64)
    expected = counts.sum() / counts.size
    return float(((counts - expected) ** 2 / expected).sum())


def _position_counts(n, keys):
    counts = np.zeros((n, n))
    for seed, epoch in keys:
        p = order(n, True, seed, epoch)
        counts[np.arange(n), p] += 1  # row: position, column: index found there
    return counts


@pytest.mark.parametrize("n", [2, 7, 10, 16])
def test_shuffle_positions_uniform_over_seeds(n):
    counts = _position_counts(n, [(1000 + s, 0) for s in range(3000)])
    # Each cell is Binomial(S, 1/n) and no margin is estimated, so for truly random
    # permutations the statistic has mean n(n-1) and sd sqrt(2n(n-1)): chi-square, n(n-1) dof.
    dof = n * (n - 1)
    assert _chi2(counts) < _chi2_threshold(dof), counts
    # the statistic has power: the unshuffled order (all mass on the diagonal) fails it
    assert _chi2(np.eye(n) * 3000) > _chi2_threshold(dof)


def test_shuffle_positions_uniform_over_epochs():
    counts = _position_counts(9, [(42, e) for e in range(3000)])
    assert _chi2(counts) < _chi2_threshold(9 * 8)


def _neighbour_cells(n, perms):
    counts = collections.Counter((p.index(0), p.index(1)) for p in perms)
    return [counts[(a, b)] for a in range(n) for b in range(n) if a != b]


def test_shuffle_neighbours_independent():
    # Where do indices 0 and 1 land together? 30 ordered pairs of positions for n = 6.
    n, trials = 6, 3000
    cells = _neighbour_cells(n, [order(n, True, s, 1) for s in range(trials)])
    assert sum(cells) == trials
    assert _chi2(cells) < _chi2_threshold(len(cells) - 1)
    # power: a random rotation has uniform positions but fails this test
    rotations = [[(k + s * 7919) % n for k in range(n)] for s in range(trials)]
    assert _chi2(_neighbour_cells(n, rotations)) > _chi2_threshold(len(cells) - 1)


def test_shuffle_uniform_at_larger_n():
    # position of index 0 at n = 4097 (just past a power of two) in 16 bins over 2000 seeds
    n, bins = 4097, 16
    hist = np.zeros(bins)
    for s in range(2000):
        inv = C.permutation_inverse(n, s, 0, torch.tensor([0]))  # position holding index 0
        hist[int(inv.item()) * bins // n] += 1
    assert _chi2(hist) < _chi2_threshold(bins - 1)


# --- errors -------------------------------------------------------------------------------------
class _NoLen:
    def __getitem__(self, i):
        return i


def test_errors():
    with pytest.raises(TypeError, match="__len__"):
        fm.DistributedDataContainer(_NoLen(), rank=0, world_size=1)
    with pytest.raises(TypeError, match="__len__"):
        fm.DistributedSampler(_NoLen(), num_replicas=1, rank=0)
    with pytest.raises(TypeError, match="__getitem__"):
        fm.DistributedDataContainer({1, 2}, rank=0, world_size=1)
    for bad in (-1, 2**64, 1.5, "3", True, None):
        with pytest.raises(ValueError, match="seed"):
            fm.DistributedDataContainer([1], seed=bad, rank=0, world_size=1)
        with pytest.raises(ValueError, match="seed"):
            fm.DistributedSampler(3, num_replicas=1, rank=0, seed=bad)
        with pytest.raises(ValueError, match="epoch"):
            fm.DistributedDataContainer([1], rank=0, world_size=1).set_epoch(bad)
        with pytest.raises(ValueError, match="epoch"):
            fm.DistributedSampler(3, num_replicas=1, rank=0).set_epoch(bad)
    fm.DistributedSampler(3, num_replicas=1, rank=0, seed=np.int64(3)).set_epoch(
        np.uint64(2**64 - 1)
    )
    with pytest.raises(ValueError, match=r"rank must be an int in \[0, world_size=2\), got 2"):
        fm.DistributedDataContainer([1], rank=2, world_size=2)
    with pytest.raises(ValueError, match="num_replicas"):
        fm.DistributedSampler(3, num_replicas=0, rank=0)
    with pytest.raises(ValueError, match="length of dataset"):
        fm.DistributedSampler(-1, num_replicas=1, rank=0)
    d = fm.DistributedDataContainer(list(range(5)), rank=1, world_size=2)
    with pytest.raises(IndexError, match="rank 1 holds 3"):
        d[3]
    with pytest.raises(TypeError, match="ints"):
        d["0"]
    with pytest.raises(ValueError, match=r"state\['n'\]"):
        d.load_state_dict({"epoch": 0, "seed": 0, "position": 0, "n": 6})
    with pytest.raises(ValueError, match="position"):
        d.load_state_dict({"epoch": 0, "seed": 0, "position": 4})
    with pytest.raises(ValueError, match="lacks"):
        d.load_state_dict({"epoch": 0})
    with pytest.raises(ValueError, match="consumed"):
        d.state_dict(consumed=4)
    with pytest.raises(ValueError, match="positions"):
        C.shard_indices(5, 2, 0, "pad", False, 0, 0, 2, 2)
    with pytest.raises(ValueError, match="mode"):
        C.shard_range(5, 2, 0, "ceil")
    if not fm.Initialized():
        with pytest.raises(RuntimeError, match="Init"):
            fm.DistributedDataContainer([1, 2])
    else:
        d = fm.DistributedDataContainer([1, 2])
        assert (d.rank, d.world_size) == (fm.local_rank(), fm.total_workers())


# --- resume -------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", list(MODES))
def test_sampler_resume_equals_uninterrupted(mode):
    n, p, r = 23, 3, 2

    def make(seed=5):
        return fm.DistributedSampler(n, num_replicas=p, rank=r, seed=seed, **MODES[mode])

    full = make()
    full.set_epoch(4)
    want = list(full)
    for k in (0, 1, 5, len(want)):
        a = make()
        a.set_epoch(4)
        it = iter(a)
        head = [next(it) for _ in range(k)]
        state = a.state_dict()
        assert state["position"] == k and state["epoch"] == 4
        b = make(seed=99)  # the seed comes from the state
        b.load_state_dict(pickle.loads(pickle.dumps(state)))
        b.set_epoch(4)  # same epoch: keeps the position
        assert len(b) == len(want) - k
        assert head + list(b) == want
        assert list(b) == want  # later iterators start at 0
        b.set_epoch(5)
        full.set_epoch(5)
        assert list(b) == list(full)
    # set_epoch to another epoch drops a loaded position
    c = make()
    c.load_state_dict({"epoch": 4, "seed": 5, "position": 3})
    c.set_epoch(6)
    full.set_epoch(6)
    assert list(c) == list(full)


def test_sampler_resume_with_dataloader_consumed():
    n, bs = 40, 4
    ds = torch.arange(float(n))
    s = fm.DistributedSampler(ds, num_replicas=2, rank=0, seed=1)
    want = torch.cat(list(torch.utils.data.DataLoader(ds, batch_size=bs, sampler=s)))
    loader = torch.utils.data.DataLoader(ds, batch_size=bs, sampler=s, num_workers=2)
    got = []
    for step, b in enumerate(loader, 1):
        got.append(b)
        if step == 2:
            state = s.state_dict(consumed=step * bs)  # the loader itself has read ahead
            break
    del loader
    assert state["position"] == 2 * bs
    s2 = fm.DistributedSampler(ds, num_replicas=2, rank=0, seed=1)
    s2.load_state_dict(state)
    got += list(torch.utils.data.DataLoader(ds, batch_size=bs, sampler=s2))
    assert torch.equal(torch.cat(got), want)


@pytest.mark.parametrize("mode", list(MODES))
def test_container_resume_equals_uninterrupted(mode):
    n, p, r = 29, 4, 3

    def make():
        return fm.DistributedDataContainer(
            list(range(n)), shuffle=True, seed=8, rank=r, world_size=p, **MODES[mode]
        )

    full = make()
    full.set_epoch(2)
    want = list(full)
    for k in (0, 3, len(want)):
        a = make()
        a.set_epoch(2)
        head = list(itertools.islice(iter(a), k))  # takes k items, never a k+1-th
        state = a.state_dict()
        assert state["position"] == k
        b = make()
        b.load_state_dict(state)
        b.set_epoch(2)  # a resumed loop may call set_epoch with the same epoch
        assert len(b) == len(want) - k
        assert head + [b[i] for i in range(len(b))] == want
        assert head + list(b) == want
        b.set_epoch(3)
        full.set_epoch(3)
        assert list(b) == list(full)
    # with a DataLoader, the loop says how much it consumed
    c = make()
    c.set_epoch(2)
    loader = torch.utils.data.DataLoader(c, batch_size=2)
    head = [int(v) for v in next(iter(loader))]
    state = c.state_dict(consumed=2)
    d = make()
    d.load_state_dict(state)
    assert head + [int(v) for b in torch.utils.data.DataLoader(d, batch_size=2) for v in b] == want


def _dropout_loop(data, start, steps, stop_at=None, evaluate=False, unbatched=False):
    """tests/workers/stop_train.py's loop in one process: a DataLoader without ``generator=``
    over ``data`` (a container, or a sampler over 16 items, or over 4 with ``unbatched``) from step ``start``, each step's
    first draw from torch's global generator (dropout's) kept; ``evaluate``: an evaluation
    DataLoader (no generator= either) iterated after every epoch. A stop after step
    ``stop_at`` returns (draws, the data position, the generator states), what a checkpoint
    keeps; else (draws, None, None)."""
    if unbatched:  # a sampler over 4 items, batch_size=None
        loader = torch.utils.data.DataLoader(list(range(4)), batch_size=None, sampler=data)
    elif isinstance(data, fm.DistributedSampler):
        loader = torch.utils.data.DataLoader(list(range(16)), batch_size=4, sampler=data)
    else:
        loader = torch.utils.data.DataLoader(data, batch_size=4)
    draws, step, epoch = [], start, data.epoch
    while step < steps:
        data.set_epoch(epoch)  # the same epoch keeps a loaded position
        consumed = 0
        for batch in loader:
            draws.append(torch.rand(1).item())
            step, consumed = step + 1, consumed + (1 if isinstance(batch, int) else len(batch))
            if step == stop_at:
                return draws, data.state_dict(consumed=consumed), rng.capture()
            if step == steps:
                break
        if evaluate:
            for _ in torch.utils.data.DataLoader(list(range(4)), batch_size=2):
                pass
        epoch += 1
    return draws, None, None


@pytest.mark.parametrize("kind", ["container", "sampler", "sampler-unbatched"])
@pytest.mark.parametrize("evaluate", [False, True], ids=["train", "evaluate"])
@pytest.mark.parametrize("stop_at", [3, 4, 8], ids=["mid-epoch", "epoch-end", "second-end"])
def test_resume_draws_as_uninterrupted(stop_at, evaluate, kind):
    """A run stopped after step ``stop_at`` and resumed (the container's or sampler's
    position, the generators restored as load_checkpoint(rng=True) does) draws what a run never
    stopped draws. The resumed loop iterates the rest of the stopped epoch with a new
    DataLoader, one base-seed draw more: mid-epoch the first fetch (the sampler: its first
    iterator) puts it back; at an epoch's end (4 steps an epoch: a stop after its last step,
    which an agreed stop lands on now and then) the rest is empty and nothing is fetched: the
    draw was kept, and every later dropout mask differed."""

    def make():
        if kind.startswith("sampler"):  # unbatched: 4 items, one a step
            n = 4 if kind == "sampler-unbatched" else 16
            return fm.DistributedSampler(n, shuffle=True, seed=2, rank=0, num_replicas=1)
        return fm.DistributedDataContainer(
            list(range(16)), shuffle=True, seed=2, rank=0, world_size=1
        )

    u = kind == "sampler-unbatched"
    torch.manual_seed(0)
    want, _, _ = _dropout_loop(make(), 0, 12, evaluate=evaluate, unbatched=u)
    torch.manual_seed(0)
    head, state, saved = _dropout_loop(make(), 0, 12, stop_at, evaluate, unbatched=u)
    torch.manual_seed(99)  # a new process's generator, until the checkpoint's is restored
    resumed = make()
    resumed.load_state_dict(state)
    rng.restore(saved)
    tail, _, _ = _dropout_loop(resumed, stop_at, 12, evaluate=evaluate, unbatched=u)
    assert head + tail == want


# --- pickling and DataLoader workers ------------------------------------------------------------
def test_pickle_keeps_only_plain_state():
    d = fm.DistributedDataContainer(list(range(50)), shuffle=True, seed=4, rank=1, world_size=3)
    d.set_epoch(7)
    e = pickle.loads(pickle.dumps(d))
    assert [e[i] for i in range(len(e))] == [d[i] for i in range(len(d))]
    # the global-batch mode's math holds ints alone (None without it)
    plain = (int, bool, str, list, SharedInts, GlobalBatches, type(None))
    assert all(isinstance(v, plain) for v in vars(d).values())
    s = fm.DistributedSampler(50, num_replicas=3, rank=1)
    it = iter(s)
    next(it), next(it)
    t = pickle.loads(pickle.dumps(s))
    assert t.state_dict() == s.state_dict() and t.state_dict()["position"] == 2


def test_global_batches_do_not_depend_on_the_world_size():
    # Step s's G samples, cut into micro-batches of m, are the same at any world size; rank r
    # takes micro-batches r*k .. r*k+k-1 of each step, and knows each one's global index.
    # Where W does not divide the 6 micro-batches (4, 5 ranks), the first 6 mod W ranks take
    # one more, in the same contiguous rank order (issue 51); 7 ranks are more than 6.
    n, G, m = 50, 12, 2
    data = list(range(n))

    def sampler(r, w):
        return fm.DistributedSampler(
            n, num_replicas=w, rank=r, seed=5, global_batch_size=G, micro_batch_size=m
        )

    def container(r, w):
        return fm.DistributedDataContainer(
            data,
            shuffle=True,
            seed=5,
            rank=r,
            world_size=w,
            global_batch_size=G,
            micro_batch_size=m,
        )

    for make in (sampler, container):
        results = []
        for world in (1, 2, 3, 4, 5, 6):
            per_step = [[None] * (G // m) for _ in range(n // G)]
            firsts = []
            for r in range(world):
                obj = make(r, world)
                obj.set_epoch(2)
                got = list(obj)
                k = G // m // world + (r < G // m % world)
                assert obj.micro_batches_per_rank == k
                assert len(got) == len(obj) == (n // G) * k * m
                firsts.append(obj.micro_batch(0)[1])
                for j in range(len(got) // m):
                    step, index = obj.micro_batch(j)
                    per_step[step][index] = got[j * m : (j + 1) * m]
            assert firsts == sorted(firsts) and firsts[0] == 0  # rank order: global order
            results.append(per_step)
        assert all(res == results[0] for res in results)
        flat = [i for step in results[0] for mb in step for i in mb]
        assert len(set(flat)) == len(flat) == (n // G) * G
        assert flat != sorted(flat)  # shuffled
    for world in (7, 12):
        with pytest.raises(ValueError, match=f"6 micro-batches.*fewer than the {world} ranks"):
            fm.DistributedSampler(
                n, num_replicas=world, rank=0, global_batch_size=G, micro_batch_size=m
            )
    with pytest.raises(ValueError, match="multiple of micro_batch_size=5"):
        fm.DistributedDataContainer(
            data, rank=0, world_size=1, global_batch_size=G, micro_batch_size=5
        )
    with pytest.raises(ValueError, match="together"):
        fm.DistributedSampler(n, num_replicas=1, rank=0, global_batch_size=G)
    d = fm.DistributedDataContainer(
        data, rank=1, world_size=2, global_batch_size=G, micro_batch_size=m
    )
    e = pickle.loads(pickle.dumps(d))
    assert [e[i] for i in range(len(e))] == d.indices().tolist() == list(d)


def test_dataloader_with_workers():
    n = 50
    data = torch.utils.data.TensorDataset(torch.arange(n) * 10, torch.arange(n))
    for r in range(2):
        d = fm.DistributedDataContainer(data, shuffle=True, seed=3, rank=r, world_size=2)
        d.set_epoch(1)
        loader = torch.utils.data.DataLoader(d, batch_size=4, num_workers=2)
        x, y = (torch.cat(t) for t in zip(*loader))
        assert torch.equal(y, d.indices()) and torch.equal(x, y * 10)
        s = fm.DistributedSampler(data, num_replicas=2, rank=r, seed=3)
        s.set_epoch(1)
        loader = torch.utils.data.DataLoader(data, batch_size=4, sampler=s, num_workers=2)
        assert torch.equal(torch.cat([b[1] for b in loader]), d.indices())


def _epoch_order(n, p, r, seed, epoch, start=0):
    o = order(n, True, seed, epoch)
    return [o[q] for q in ref_positions(n, p, r, "pad")][start:]


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_persistent_workers_follow_set_epoch(method):
    # The workers get the container once, when they start; set_epoch and load_state_dict in
    # the main process must still reach them, under either start method.
    n, p, r, seed = 30, 2, 1, 6
    data = torch.utils.data.TensorDataset(torch.arange(n))
    d = fm.DistributedDataContainer(data, shuffle=True, seed=seed, rank=r, world_size=p)
    s = fm.DistributedSampler(data, num_replicas=p, rank=r, seed=seed)
    # batches (__getitems__) under `method`; single samples (__getitem__) from forked workers
    # that start first, so under spawn they see the values from before they were ever sent
    loaders = [
        torch.utils.data.DataLoader(
            d, batch_size=4, num_workers=2, persistent_workers=True, multiprocessing_context=method
        ),
        torch.utils.data.DataLoader(
            d,
            batch_size=None,
            num_workers=1,
            persistent_workers=True,
            multiprocessing_context="fork",
        ),
    ]
    # the sampler lives in the main process: it always followed set_epoch
    sampled = torch.utils.data.DataLoader(
        data,
        batch_size=4,
        sampler=s,
        num_workers=1,
        persistent_workers=True,
        multiprocessing_context=method,
    )
    wants = []
    for epoch in range(3):
        d.set_epoch(epoch)
        s.set_epoch(epoch)
        want = _epoch_order(n, p, r, seed, epoch)
        for loader in reversed(loaders):
            got = [int(v) for batch in loader for v in batch[0].reshape(-1)]
            assert got == want, (method, epoch, loader.batch_size)
        assert [int(v) for b in sampled for v in b[0]] == want, (method, epoch)
        wants.append(want)
    assert wants[0] != wants[1] != wants[2]
    d.load_state_dict({"epoch": 9, "seed": 2, "position": 5})
    got = [int(v) for batch in loaders[0] for v in batch[0]]
    assert got == _epoch_order(n, p, r, 2, 9, start=5)


def test_copies_are_independent():
    d = fm.DistributedDataContainer(list(range(40)), shuffle=True, seed=1, rank=0, world_size=2)
    d.set_epoch(3)
    for make in (copy.copy, copy.deepcopy, lambda x: pickle.loads(pickle.dumps(x))):
        e = make(d)
        assert list(e) == list(d) and e.state_dict() == d.state_dict()
        e.set_epoch(4)
        assert d.epoch == 3 and e.epoch == 4
        d.set_epoch(5)
        assert e.epoch == 4
        d.set_epoch(3)
    # a copy still reaches its own persistent workers
    e = pickle.loads(pickle.dumps(d))
    loader = torch.utils.data.DataLoader(e, batch_size=5, num_workers=1, persistent_workers=True)
    for epoch in (1, 2):
        e.set_epoch(epoch)
        assert [int(v) for b in loader for v in b] == _epoch_order(40, 2, 0, 1, epoch)


def test_sampler_refuses_a_container():
    d = fm.DistributedDataContainer(list(range(10)), rank=1, world_size=2)
    for dataset in (d, torch.utils.data.Subset(d, range(3))):
        with pytest.raises(TypeError) as e:
            fm.DistributedSampler(dataset, num_replicas=2, rank=1)
        for needle in (
            "DistributedDataContainer",
            "rank 1",
            "1/4",
            "without a distributed sampler",
            "the full dataset with DistributedSampler(full_dataset)",
        ):
            assert needle in str(e.value), (needle, str(e.value))
    # nothing is sharded twice when either side has one part
    fm.DistributedSampler(d, num_replicas=1, rank=0)
    fm.DistributedSampler(
        fm.DistributedDataContainer(list(range(10)), rank=0, world_size=1), num_replicas=2, rank=1
    )


def test_docstring_examples_run():
    from fluxmpi_py import data
    from fluxmpi_py._util import shared_view
    from fluxmpi_py.data import container, loader_check

    for m in (container, shared_view, loader_check):
        res = doctest.testmod(m, optionflags=doctest.ELLIPSIS)
        assert res.failed == 0 and res.attempted > 0, (m.__name__, res)
    missing = [n for n in data.__all__ if ">>>" not in (getattr(data, n).__doc__ or "")]
    assert not missing, f"no example in the docstring of {missing}"


# --- several ranks ------------------------------------------------------------------------------
@pytest.mark.parametrize("case", worker_params("data_worker.py", [1, 2, 4], timeout=240))
def test_multirank(case):
    case.check_passed()
