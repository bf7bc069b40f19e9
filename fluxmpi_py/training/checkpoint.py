"""Checkpoints for data-parallel jobs: rank 0 writes and reads, every rank ends up identical.

``save_checkpoint(path, model=model, optimizer=opt, epoch=e)`` stores ``state_dict()`` of
every object that has one (modules, optimizers, DistributedOptimizer, LR schedulers,
GradScaler, DistributedDataContainer) and everything else as it is. Only rank 0 writes, to a
temporary file in the same directory that is then renamed over ``path``, so a crash never
leaves a half-written checkpoint behind.

``load_checkpoint(path, model=model, optimizer=opt)`` reads on rank 0, brings the contents to
every rank through ``synchronize_`` and loads them into the objects passed by keyword.

``rng=True`` also stores each rank's random number generator states (torch, CUDA when
initialized, numpy, Python's ``random``); ``load_checkpoint`` puts them back on each rank, so
a resumed run draws the same random numbers as an uninterrupted one.

Both are collectives (every rank calls them). An error on any rank, such as a missing file on
rank 0, raises the same exception on every rank instead of leaving the others waiting.

Nothing loads wrong: the file ends with a digest of its bytes (crc32 by default; see
``_DIGEST``), checked before anything is read, so a damaged file raises ValueError on every
rank naming it. A checkpoint written before digests (format version 1) still loads, with a
warning that it cannot be checked; a plain ``torch.save`` dict loads unchecked, as before.
Loading is all or nothing: every target is checked against its entry (keys, shapes, dtypes,
optimizer groups and per-parameter state) on every rank before any of them is touched.
"""

from __future__ import annotations

import os
import pickle
import warnings
from collections import OrderedDict
from typing import Any

import torch

from .._util import rng as _rng
from .._util.files import start_digest_check, write_atomic
from ..runtime.agreement import bcast_bytes, raise_together, user_call
from ..runtime.world import local_rank, total_workers
from ..sync.synchronize import synchronize_
from ._checkpoint_fit import check_fits, load_order

__all__ = ["save_checkpoint", "load_checkpoint"]

_FORMAT = "fluxmpi_py.checkpoint"
_VERSION = 2  # 2: the file ends with a digest trailer (_files.check_digest)
# The digest written with every checkpoint: "crc32" (zlib) or "sha256" (hashlib), or None for
# none (benchmarks/bench_checkpoint.py compares them; docs/measurements.md has the figures).
_DIGEST = "crc32"


def _check_path(path, fn: str) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            f"{fn}: path must be a str or os.PathLike, got {type(path).__name__} "
            f"on rank {local_rank()}"
        )
    return os.fspath(path)


def _check_flag(value, fn: str, name: str, allowed: tuple, default: str) -> None:
    """A reserved keyword (rng=, weights_only=) must hold one of its flags: the user's own
    object of that name would otherwise be taken for the flag."""
    if not any(value is a for a in allowed):
        shown = " or ".join(map(repr, allowed))
        raise TypeError(
            f"{fn}: {name}= is reserved for the flag {shown} (default {default}), got a "
            f"{type(value).__name__}; store your own object under another name, e.g. "
            f"{name}_state=..."
        )


def _state_of(obj: Any) -> Any:
    return obj.state_dict() if callable(getattr(obj, "state_dict", None)) else obj


def _gather_rng_states() -> list | None:
    """Every rank's generator states, on rank 0 (a list by rank; None elsewhere); a
    collective of one small broadcast per rank."""
    error, mine = None, b""
    try:
        mine = pickle.dumps(_rng.capture())
    except Exception as e:  # folded into the agreement, so that no rank waits alone
        error = e
    raise_together(error, "save_checkpoint(rng=True)")
    states = [pickle.loads(bcast_bytes(mine, r)) for r in range(total_workers())]
    return states if local_rank() == 0 else None


def _disk_error(path: str, e: OSError) -> OSError:
    kept = "the previous file is kept" if os.path.exists(path) else "no file was written"
    message = f"save_checkpoint: could not write {path!r}: {e.strerror or e}; {kept}"
    return type(e)(message) if e.errno is None else type(e)(e.errno, message)


@user_call.of("save_checkpoint()")
def save_checkpoint(path, *, rng: bool = False, **objects) -> str:
    """Save ``objects`` to ``path`` from rank 0, atomically; a collective. Returns the path.

    Objects with a ``state_dict()`` (modules, optimizers, schedulers, ...) are stored as their
    state dict, anything else (numbers, tensors, dicts of them) as it is. The file is written
    to a temporary name in the same directory, fsynced and renamed over ``path``. No rank
    returns before the file is complete, so any rank may read it right after. A failed write
    (a full disk) raises OSError on every rank, naming the path, and leaves any previous file
    at ``path`` as it was.

    ``rng=True`` also stores every rank's random number generator states (torch, CUDA when
    initialized, numpy, Python's ``random``), which ``load_checkpoint`` restores on each rank.
    ``rng`` is reserved for that flag: any other value (a tensor, say) raises TypeError on
    every rank; store your own generator state under another name (``rng_state=...``).
    The file ends with a digest of its bytes (crc32), which ``load_checkpoint`` checks.
    Temporary files that a killed save of ``path`` left beside it (``.<name>.tmp<pid>...``,
    no live process of that pid holding them open) are removed.
    A DataLoader without a generator of its own draws its base seed from the global
    generator each time it is iterated, once more in a resumed run: a DistributedDataContainer
    loaded mid-epoch undoes that draw at its first fetch in the main process. With DataLoader
    workers, give it one (``generator=torch.Generator().manual_seed(s)``).

    >>> import torch, tempfile, os, fluxmpi_py as fm; fm.Init()
    >>> model = torch.nn.Linear(2, 1)
    >>> path = fm.save_checkpoint(os.path.join(tempfile.mkdtemp(), "ckpt.pt"), model=model, epoch=3)
    >>> sorted(torch.load(path)["objects"])
    ['epoch', 'model']
    """
    error = None
    try:
        path = _check_path(path, "save_checkpoint")
        _check_flag(rng, "save_checkpoint", "rng", (True, False), "False")
        if not objects:
            raise ValueError(
                "save_checkpoint: nothing to save; pass objects by keyword, "
                "e.g. save_checkpoint(path, model=model, optimizer=opt)"
            )
    except Exception as e:  # folded into the agreement below, so every rank raises it
        error = e
    raise_together(error, f"save_checkpoint({path!r})")
    error = None
    states = _gather_rng_states() if rng else None
    try:
        if local_rank() == 0:
            payload = {
                "format": _FORMAT,
                "version": _VERSION,
                "digest": _DIGEST,
                "world_size": total_workers(),
                "objects": {k: _state_of(v) for k, v in objects.items()},
            }
            if states is not None:
                payload["rng"] = states
            try:
                write_atomic(path, lambda f: torch.save(payload, f), durable=True, digest=_DIGEST)
            except OSError as e:
                raise _disk_error(path, e) from e
    except Exception as e:  # folded into the agreement below, so every rank raises it
        error = e
    raise_together(
        error, f"save_checkpoint({path!r})"
    )  # also keeps the others until rank 0 is done
    return path


class _Slot:
    """Where a tensor was in the tree; the tensors travel separately, coalesced."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index

    def __reduce__(self):
        return (_Slot, (self.index,))


def _same_dict(tree: dict) -> dict:
    # Keeps OrderedDict and its attributes: a module's state dict carries _metadata (the
    # layers' versions), which load_state_dict reads.
    if type(tree) is not OrderedDict:
        return {}
    out: OrderedDict = OrderedDict()
    out.__dict__.update(getattr(tree, "__dict__", {}))
    return out


def _map_leaves(tree: Any, is_leaf, fn) -> Any:
    """`tree` with every leaf (is_leaf) replaced by fn(leaf), through dicts, lists and tuples."""
    if is_leaf(tree):
        return fn(tree)
    if isinstance(tree, dict):
        out = _same_dict(tree)
        for k, v in tree.items():
            out[k] = _map_leaves(v, is_leaf, fn)
        return out
    if isinstance(tree, list):
        return [_map_leaves(v, is_leaf, fn) for v in tree]
    if type(tree) is tuple:
        return tuple(_map_leaves(v, is_leaf, fn) for v in tree)
    return tree


def _split(tree: Any, tensors: list[torch.Tensor]) -> Any:
    """Replace the tensors in a nested dict/list/tuple by _Slot markers, collecting them."""

    def take(t):
        tensors.append(t.detach().contiguous())
        return _Slot(len(tensors) - 1)

    return _map_leaves(tree, lambda x: isinstance(x, torch.Tensor), take)


def _join(tree: Any, tensors: list[torch.Tensor]) -> Any:
    return _map_leaves(tree, lambda x: isinstance(x, _Slot), lambda s: tensors[s.index])


def _sync_tensors(tensors: list[torch.Tensor]) -> None:
    if not tensors:
        return
    synchronize_(tensors, root_rank=0)  # coalesced broadcast, in place


def _read(path: str, weights_only: bool) -> tuple[dict, list | None]:
    """The checkpoint's objects and its generator states by rank (None when it has none),
    after checking its digest (ValueError naming the path when it is damaged)."""

    def checked_digest() -> str | None:
        try:
            return check()
        except ValueError as e:
            raise ValueError(f"load_checkpoint: {e}; nothing was loaded") from None

    # The digest is checked while torch.load reads (on another core), except where the
    # unpickler may run arbitrary code (weights_only=False): then first.
    check = start_digest_check(path)
    if not weights_only:
        checked_digest()
    try:
        with open(path, "rb") as f:
            data = torch.load(f, map_location="cpu", weights_only=weights_only)
    except OSError:
        raise  # a missing or unreadable file: its own error names it
    except (RuntimeError, EOFError) as e:  # torch's zip reader on a cut or damaged file
        checked_digest()  # damage, when that is the cause, is what to report
        raise RuntimeError(
            f"load_checkpoint: cannot read {path!r} (damaged, or not a torch file): {e}"
        ) from e
    except Exception:
        checked_digest()
        raise
    digest = checked_digest()
    if isinstance(data, dict) and data.get("format") == _FORMAT:
        if digest is None and data.get("digest"):
            raise ValueError(
                f"load_checkpoint: {path!r} is damaged: it was saved with a "
                f"{data['digest']} digest, which is missing from its end; nothing was loaded"
            )
        if digest is None and data.get("version", 1) < 2:
            warnings.warn(
                f"load_checkpoint: {path!r} was saved before checkpoints carried a digest, "
                "so it cannot be checked for damage; save it again to add one",
                stacklevel=3,
            )
        return data["objects"], data.get("rng")
    if isinstance(data, dict):  # a plain torch.save of a dict: take it as it is
        return data, None
    raise ValueError(
        f"load_checkpoint: {path!r} holds a {type(data).__name__}, not a checkpoint "
        f"dict (write it with save_checkpoint)"
    )


def _rng_for_world(states: list | None, rng: bool | None, path: str) -> list | None:
    """The generator states to restore (rank 0 decides): ``rng`` None restores them when the
    checkpoint has them for this world size, True requires them, False skips them."""
    if rng is False:
        return None
    world = total_workers()
    if states is None:
        if rng:
            raise ValueError(
                f"load_checkpoint(rng=True): {path!r} holds no random states "
                f"(save it with save_checkpoint(..., rng=True))"
            )
        return None
    if len(states) != world:
        message = (
            f"load_checkpoint: {path!r} holds the random states of {len(states)} ranks, "
            f"this job has {world}"
        )
        if rng:
            raise ValueError(message)
        warnings.warn(message + "; they are not restored", stacklevel=3)
        return None
    return states


@user_call.of("load_checkpoint()")
def load_checkpoint(path, *, weights_only: bool = True, rng: bool | None = None, **targets) -> dict:
    """Load a checkpoint on rank 0, bring it to every rank and return it; a collective.

    Each keyword names an entry of the checkpoint and an object to restore in place:
    ``load_state_dict`` is called on modules, optimizers and anything that has one, and
    tensors are copied into. The returned dict holds every entry as stored (state dicts for
    modules and optimizers), identical on every rank. ``weights_only`` is passed to
    ``torch.load``; True accepts tensors, numbers, strings and containers of them.

    All or nothing: before any target is touched, every rank checks each one against its
    entry (a module's keys, shapes and dtypes; an optimizer's parameter groups, their sizes
    and the shapes of per-parameter state such as ``exp_avg``; a tensor's shape and dtype;
    floating point may load into another floating dtype) and a misfit raises ValueError on
    every rank, naming the target and the first differences. Targets of other kinds
    (schedulers, ...) load first, so that their failure too leaves the checked ones untouched.
    A damaged file (its digest does not match its bytes) raises ValueError on every rank,
    naming the path, before anything is loaded. ``rng`` and ``weights_only`` are reserved
    flags (TypeError for any other value).

    Generator states saved with ``rng=True`` are restored on each rank (its own), when the
    checkpoint holds them for this number of ranks (for another number: a warning, and they
    are not restored). ``rng=True`` requires them (ValueError otherwise); ``rng=False``
    leaves the generators alone.

    >>> import torch, tempfile, os, fluxmpi_py as fm; fm.Init()
    >>> model = torch.nn.Linear(2, 1)
    >>> path = fm.save_checkpoint(os.path.join(tempfile.mkdtemp(), "ckpt.pt"), model=model, epoch=3)
    >>> fresh = torch.nn.Linear(2, 1)
    >>> fm.load_checkpoint(path, model=fresh)["epoch"]
    3
    >>> torch.equal(fresh.weight, model.weight)
    True
    """
    error = None
    skeleton, meta = None, None
    tensors: list[torch.Tensor] = []
    try:
        path = _check_path(path, "load_checkpoint")
        _check_flag(rng, "load_checkpoint", "rng", (None, True, False), "None")
        _check_flag(weights_only, "load_checkpoint", "weights_only", (True, False), "True")
        for name, obj in targets.items():
            if not (
                callable(getattr(obj, "load_state_dict", None)) or isinstance(obj, torch.Tensor)
            ):
                raise TypeError(
                    f"load_checkpoint: {name}= must have load_state_dict() or be a "
                    f"tensor, got {type(obj).__name__} on rank {local_rank()}"
                )
        if local_rank() == 0:
            objects, states = _read(path, weights_only)
            missing = [k for k in targets if k not in objects]
            if missing:
                raise KeyError(
                    f"load_checkpoint: {path!r} has no entry {missing[0]!r} "
                    f"(it has {sorted(map(str, objects))})"
                )
            skeleton = _split((objects, _rng_for_world(states, rng, path)), tensors)
            meta = [(tuple(t.shape), t.dtype) for t in tensors]
    except Exception as e:
        error = e
    raise_together(error, f"load_checkpoint({path!r})")

    # The structure travels once as a pickle; the tensors follow, coalesced, by synchronize_.
    blob = bcast_bytes(pickle.dumps((skeleton, meta)) if local_rank() == 0 else b"", 0)
    skeleton, meta = pickle.loads(blob)
    if local_rank() != 0:
        tensors = [torch.empty(shape, dtype=dtype) for shape, dtype in meta]
    _sync_tensors(tensors)
    objects, states = _join(skeleton, tensors)

    error = None
    try:  # every rank checks every target before any rank touches one
        for name, obj in targets.items():
            check_fits(name, obj, objects[name], path)
    except Exception as e:
        error = e
    raise_together(error, f"load_checkpoint({path!r})")

    error = None
    try:
        for name, obj in load_order(targets):
            if isinstance(obj, torch.Tensor):
                with torch.no_grad():
                    obj.copy_(objects[name])
            else:
                obj.load_state_dict(objects[name])
        if states is not None:
            _rng.restore(states[local_rank()])
    except Exception as e:
        error = e
    raise_together(error, f"load_checkpoint({path!r})")
    return objects
