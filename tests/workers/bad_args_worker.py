"""A bad argument on one rank only, generated from the API (issue 46); run by
tests/test_entry_points.py at 2 and 3 ranks, one launch per world size.

Every public callable that communicates (``fm.__all__`` and ``fluxmpi_py.horovod``, as
``entry_kind`` marks them: "collective" or "group") gets a good call from GOOD below, the one
thing written by hand per callable (a new public collective without one fails
case_every_collective_has_a_good_call). Then, for each parameter of its signature, each bad
value that the parameter's good value suggests (wrong types, -1, 2**63, None; for a tensor:
sparse, nested, meta, quantized, non-contiguous, expanded, complex; a bad op, root_rank,
group) is given on the last rank only, the good one elsewhere. Every rank must end the call
alike: all raise the same exception type, or all return (a value that is good after all, such
as a non-contiguous tensor); and one more collective (allreduce_) must then work on every rank.
"""

import inspect
import os
import tempfile

import torch
from harness import fm, run_cases

import fluxmpi_py.horovod as hvd
from fluxmpi_py.runtime.entry import entry_kind

fm.Init()
W, RANK = fm.total_workers(), fm.local_rank()
LAST = W - 1
COMMUNICATING = ("collective", "group")


def t(n=4):
    return torch.arange(float(n))


def rows(per_rank=2):
    return torch.ones(per_rank * W, 3)


def model():
    torch.manual_seed(0)
    return torch.nn.Linear(3, 2)


def model_with_grads():
    m = model()
    m(torch.ones(2, 3)).sum().backward()
    return m


def sgd():
    return torch.optim.SGD(model().parameters(), lr=0.1)


_DIR = []


def shared_dir():
    """One directory that every rank names alike (rank 0's)."""
    if not _DIR:
        _DIR.append(fm.broadcast_object(tempfile.mkdtemp() if RANK == 0 else None))
    return _DIR[0]


def ckpt():
    path = os.path.join(shared_dir(), "c.pt")
    if not os.path.exists(path):
        fm.save_checkpoint(path, model=model())
    fm.barrier()
    return path


# name -> a good call: (args, kwargs). The same on every rank.
GOOD = {
    "allreduce_": lambda: ([t()], {"op": "sum"}),
    "bcast_": lambda: ([t()], {"root_rank": 0}),
    "reduce_": lambda: ([t()], {"op": "sum", "root_rank": 0}),
    "Iallreduce": lambda: ([t()], {"op": "sum"}),
    "Ibcast": lambda: ([t()], {"root_rank": 0}),
    "allreduce": lambda: ([t()], {"op": "sum"}),
    "broadcast": lambda: ([t()], {"root_rank": 0}),
    "allgather": lambda: ([rows()], {}),
    "gather": lambda: ([rows()], {"root_rank": 0}),
    "scatter": lambda: ([rows()], {"root_rank": 0}),
    "reduce_scatter": lambda: ([rows()], {"op": "sum"}),
    "alltoall": lambda: ([rows()], {}),
    "Iallgather": lambda: ([rows()], {}),
    "Igather": lambda: ([rows()], {"root_rank": 0}),
    "Iscatter": lambda: ([rows()], {"root_rank": 0}),
    "Ireduce_scatter": lambda: ([rows()], {"op": "sum"}),
    "Ialltoall": lambda: ([rows()], {}),
    "grouped_allgather": lambda: ([[rows(), rows(1)]], {}),
    "grouped_gather": lambda: ([[rows(), rows(1)]], {"root_rank": 0}),
    "grouped_scatter": lambda: ([[rows(), rows(1)]], {"root_rank": 0}),
    "grouped_reduce_scatter": lambda: ([[rows(), rows(1)]], {"op": "sum"}),
    "grouped_alltoall": lambda: ([[rows(), rows(1)]], {}),
    "grouped_allreduce_": lambda: ([[t(), t(2)]], {"op": "sum"}),
    "grouped_bcast_": lambda: ([[t(), t(2)]], {"root_rank": 0}),
    "broadcast_object": lambda: ([{"a": 1}], {"root_rank": 0}),
    "allgather_object": lambda: ([1], {}),
    "barrier": lambda: ([], {}),
    "new_group": lambda: ([list(range(W))], {}),
    "synchronize_": lambda: ([model()], {"root_rank": 0}),
    "DistributedDataContainer": lambda: ([list(range(10))], {"seed": 0}),
    "DistributedSampler": lambda: ([list(range(10))], {"seed": 0}),
    "DistributedOptimizer": lambda: ([sgd()], {"op": "average"}),
    "allreduce_gradients": lambda: ([model_with_grads()], {"op": "average"}),
    "synchronize_buffers_": lambda: ([torch.nn.BatchNorm1d(3)], {"mode": "average"}),
    "check_consistency": lambda: ([model()], {}),
    "save_checkpoint": lambda: ([os.path.join(shared_dir(), "s.pt")], {"model": model()}),
    "load_checkpoint": lambda: ([ckpt()], {"model": model()}),
    "latest_checkpoint": lambda: ([shared_dir()], {}),
}

HVD_GOOD = {
    "allreduce": lambda: ([t()], {"op": hvd.Sum}),
    "allreduce_": lambda: ([t()], {"op": hvd.Sum}),
    "allreduce_async": lambda: ([t()], {"op": hvd.Sum}),
    "allreduce_async_": lambda: ([t()], {"op": hvd.Sum}),
    "broadcast": lambda: ([t(), 0], {}),
    "broadcast_": lambda: ([t(), 0], {}),
    "broadcast_async": lambda: ([t(), 0], {}),
    "broadcast_async_": lambda: ([t(), 0], {}),
    "allgather": lambda: ([rows()], {}),
    "allgather_async": lambda: ([rows()], {}),
    "grouped_allgather": lambda: ([[rows(), rows(1)]], {}),
    "grouped_allgather_async": lambda: ([[rows(), rows(1)]], {}),
    "alltoall": lambda: ([rows()], {}),
    "alltoall_async": lambda: ([rows()], {}),
    "grouped_allreduce": lambda: ([[t(), t(2)]], {"op": hvd.Sum}),
    "grouped_allreduce_": lambda: ([[t(), t(2)]], {"op": hvd.Sum}),
    "grouped_allreduce_async": lambda: ([[t(), t(2)]], {"op": hvd.Sum}),
    "grouped_allreduce_async_": lambda: ([[t(), t(2)]], {"op": hvd.Sum}),
    "reducescatter": lambda: ([rows()], {"op": hvd.Sum}),
    "reducescatter_async": lambda: ([rows()], {"op": hvd.Sum}),
    "grouped_reducescatter": lambda: ([[rows(), rows(1)]], {"op": hvd.Sum}),
    "grouped_reducescatter_async": lambda: ([[rows(), rows(1)]], {"op": hvd.Sum}),
    "sparse_allreduce_async": lambda: ([t().to_sparse()], {"op": hvd.Sum}),
    "barrier": lambda: ([], {}),
    "shutdown": None,  # ends the Horovod session: not called here
    "join": None,  # waits for the others' steps: tests/test_join.py
    "broadcast_object": lambda: ([{"a": 1}], {"root_rank": 0}),
    "allgather_object": lambda: ([1], {}),
    "DistributedOptimizer": lambda: ([sgd()], {}),
    "broadcast_parameters": lambda: ([model().state_dict(), 0], {}),
    "broadcast_optimizer_state": lambda: ([sgd(), 0], {}),
    "add_process_set": None,  # registers a set for good: tests/test_horovod_face.py
    "remove_process_set": None,
}


def tensor_variants(good):
    """Tensors that a collective may refuse, of the good tensor's shape where they can be."""
    g = good.detach()
    g = g.to_dense() if g.layout != torch.strided else g
    n = g.numel()
    yield "sparse", g.to_sparse()
    yield "nested", torch.nested.nested_tensor([g.clone()])
    yield "meta", torch.empty_like(g, device="meta")
    yield "quantized", torch.quantize_per_tensor(g.float(), 0.5, 0, torch.qint8)
    yield (
        "non-contiguous",
        torch.zeros(2 * n)[::2].reshape(g.shape) if g.dim() < 2 else g.t().contiguous().t(),
    )
    yield "expanded", torch.zeros(1).expand(g.shape) if n else g
    yield "complex", g.to(torch.complex64)
    yield "int64", g.to(torch.int64)


def bad_values(name, good):
    """(label, value) pairs for parameter ``name`` whose good value is ``good``."""
    yield "object()", object()
    yield "'x'", "x"
    yield "-1", -1
    yield "2**63", 2**63
    yield "None", None
    if name == "op":
        yield "'median'", "median"
    if name == "root_rank":
        yield "W", W
    if isinstance(good, torch.Tensor):
        yield from tensor_variants(good)
    if isinstance(good, list) and good and isinstance(good[0], torch.Tensor):
        for label, v in tensor_variants(good[0]):
            yield f"[{label}, ...]", [v, *good[1:]]


def finish(face, name, result):
    """Wait for what an asynchronous call started, so that its errors are raised here."""
    if hasattr(result, "wait") and callable(result.wait):
        result.wait()
    elif face is hvd and "async" in name:
        hvd.synchronize(result)


def in_step():
    x = torch.ones(2)
    fm.allreduce_(x)
    assert torch.equal(x, torch.full((2,), float(W))), x


# The types a rank may raise for a bad argument: the one that raised keeps its own (a
# NotImplementedError, a ValueError of the face's own kind), the others raise its family.
FAMILIES = (ValueError, TypeError, KeyError, IndexError, OSError, RuntimeError)


def family(e):
    """The families the exception belongs to (a class of both ValueError and TypeError, such
    as Horovod's NameInFlightError, belongs to both)."""
    return tuple(f.__name__ for f in FAMILIES if isinstance(e, f)) or (type(e).__name__,)


def alike(outcomes):
    """All returned, or every rank raised an exception of one common family."""
    if all(o == "returned" for o in outcomes):
        return True
    if any(o == "returned" for o in outcomes):
        return False
    return bool(set.intersection(*(set(o) for o in outcomes)))


# pybind11's own words for arguments it cannot convert: a user should read what is wrong
# (the parameter, the value, the rank), never the compiled signature's overloads.
RAW_BINDING_TEXT = "incompatible function arguments"


def one_call(face, name, fn, args, kwargs):
    try:
        finish(face, name, fn(*args, **kwargs))
        return "returned"
    except Exception as e:  # noqa: BLE001 - the type is what every rank must share
        if RAW_BINDING_TEXT in str(e):
            return ("raw binding text: " + str(e).splitlines()[0],)
        return family(e)


def try_bad(face, name, param, label, bad):
    """The call with ``param`` bad on the last rank only; every rank must end it alike."""
    fn = getattr(face, name)
    args, kwargs = (GOOD if face is fm else HVD_GOOD)[name]()
    sig = inspect.signature(fn)
    params = [p for p in sig.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    index = next(i for i, p in enumerate(params) if p.name == param)
    if RANK == LAST:
        if index < len(args) and params[index].kind != params[index].KEYWORD_ONLY:
            args[index] = bad
        else:
            kwargs[param] = bad
    outcome = one_call(face, name, fn, args, kwargs)
    where = f"{'hvd' if face is hvd else 'fm'}.{name}({param}={label} on rank {LAST})"
    outcomes = ended_alike(where, outcome)
    raw = [o[0] for o in outcomes or () if o != "returned" and o[0].startswith("raw binding")]
    if raw:
        fail(f"{where}: {raw[0]}")


def ended_alike(where, outcome, members=None):
    """After a call with a bad argument on one rank: the ranks must be in step, and the first
    ``members`` ranks (all by default) must have ended it alike. Every rank's outcome, or None
    when the ranks were out of step."""
    try:
        in_step()
    except Exception as e:  # noqa: BLE001
        fail(f"{where}: the ranks are out of step after it ({outcome}): {e}")
        in_step()  # (keep going: each rank raised inside a call of its own, so in step again)
        return None
    outcomes = fm.allgather_object(outcome)
    if not alike(outcomes[:members]):
        fail(f"{where}: the ranks ended it differently: {outcomes[:members]}")
    return outcomes


# BAD_ARGS_KEEP_GOING=1: report every failure at the end of its case, not only the first.
KEEP_GOING = os.environ.get("BAD_ARGS_KEEP_GOING") == "1"
FAILURES = []


def fail(message):
    if not KEEP_GOING:
        raise AssertionError(message)
    FAILURES.append(message)


def raise_failures():
    """At the end of a case: every failure KEEP_GOING kept, as one AssertionError."""
    if FAILURES:
        found = "\n".join(FAILURES)
        FAILURES.clear()
        raise AssertionError(found)


def good_value(face, name, param):
    fn = getattr(face, name)
    args, kwargs = (GOOD if face is fm else HVD_GOOD)[name]()
    params = [
        p
        for p in inspect.signature(fn).parameters.values()
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    index = next(i for i, p in enumerate(params) if p.name == param)
    if index < len(args):
        return args[index]
    return kwargs.get(param, params[index].default)


def not_an_argument_error(face, name, param):
    """A parameter whose other value on one rank is another call, not a bad argument: a
    Horovod ``_async`` call with a ``name=`` waits for that name on every rank (Horovod's
    matching by name), so a name on one rank only pairs with nothing, as in Horovod."""
    return face is hvd and "_async" in name and param == "name"


def walk(face, names):
    """Every parameter of every named callable, with every bad value, on the last rank."""
    tried = 0
    for name in names:
        fn = getattr(face, name)
        for p in inspect.signature(fn).parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or not_an_argument_error(
                face, name, p.name
            ):
                continue
            for label, bad in bad_values(p.name, good_value(face, name, p.name)):
                try_bad(face, name, p.name, label, bad)
                tried += 1
    raise_failures()
    return tried


def communicating(face):
    out = []
    for n in face.__all__:
        obj = getattr(face, n)
        if callable(obj) and entry_kind(obj) in COMMUNICATING:
            out.append(n)
    return out


def case_every_collective_has_a_good_call():
    missing = [n for n in communicating(fm) if n not in GOOD]
    missing += [f"hvd.{n}" for n in communicating(hvd) if n not in HVD_GOOD]
    assert not missing, f"give these public collectives a good call in GOOD: {missing}"


def _area(prefix):
    return [n for n in communicating(fm) if getattr(fm, n).__module__.startswith(prefix)]


def case_collectives():
    assert walk(fm, _area("fluxmpi_py.collectives") + _area("fluxmpi_py.runtime")) > 100


def case_sync_and_data():
    walk(fm, _area("fluxmpi_py.sync") + _area("fluxmpi_py.data"))


def case_training():
    walk(fm, _area("fluxmpi_py.training"))


def case_checkpoint_paths_that_differ_raise_on_every_rank():
    # A path that differs by rank is a mistake (one file, rank 0 writes it): ValueError on
    # every rank naming rank 0's path and the differing one, and nothing written (issue 46).
    d = shared_dir()
    mine = os.path.join(d, f"rank{RANK}.pt")
    for call in (
        lambda: fm.save_checkpoint(mine, model=model()),
        lambda: fm.load_checkpoint(mine, model=model()),
    ):
        try:
            call()
            raise AssertionError("no rank raised for paths that differ")
        except ValueError as e:
            msg = str(e)
        assert "different paths" in msg and "rank0.pt" in msg and "rank1.pt" in msg, msg
        in_step()
    assert not any(f.startswith("rank") for f in os.listdir(d)), os.listdir(d)
    assert fm.save_checkpoint(os.path.join(d, "same.pt"), model=model()).endswith("same.pt")


def case_explicit_rank_and_size_stay_local():
    # Given a good rank and size, the data classes agree with no rank (torch's manual mode):
    # a bad argument there raises on its rank alone, and no other rank waits for it.
    for make in (
        lambda seed: fm.DistributedSampler(list(range(8)), W, RANK, seed=seed),
        lambda seed: fm.DistributedDataContainer(
            list(range(8)), rank=RANK, world_size=W, seed=seed
        ),
    ):
        outcome = one_call(None, "", make, [-1 if RANK == LAST else 0], {})
        assert outcome == (("ValueError",) if RANK == LAST else "returned"), outcome
        in_step()


# Tensors that torch's dispatcher refuses (or, for meta, answers) before it calls any c10d
# backend: they raise on their rank alone, in torch, where no backend can see them.
TORCH_REFUSES = ("nested", "meta", "quantized", "sparse")


def case_c10d_backend_calls():
    # torch.distributed on the "fluxmpi" backend: what reaches the backend is checked in its
    # agreement, so a tensor one rank alone gets wrong raises on every rank.
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("fluxmpi")
    calls = {
        "all_reduce": lambda x: dist.all_reduce(x),
        "broadcast": lambda x: dist.broadcast(x, 0),
        "reduce": lambda x: dist.reduce(x, 0),
        "all_gather_into_tensor": lambda x: dist.all_gather_into_tensor(torch.zeros(4 * W), x),
    }
    for call_name, call in calls.items():
        for label, bad in tensor_variants(t()):
            if label in TORCH_REFUSES:
                continue
            where = f"dist.{call_name}({label} tensor on rank {LAST})"
            outcome = one_call(None, call_name, call, [bad if RANK == LAST else t()], {})
            in_step()
            outcomes = fm.allgather_object(outcome)
            assert alike(outcomes), f"{where}: the ranks ended it differently: {outcomes}"


def case_horovod():
    hvd.init()
    walk(hvd, [n for n in communicating(hvd) if HVD_GOOD.get(n) is not None])


if __name__ == "__main__":
    run_cases(globals())
