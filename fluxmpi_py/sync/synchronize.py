"""synchronize_: one call brings every rank to the root's model, optimizer and any nested state.

How a call travels (every step is a collective that every rank makes in the same order):

1. Every rank walks ``obj`` into a tree: tensor leaves (parameters, buffers, optimizer state,
   generator states, tensors in containers) with their paths, and everything else.
2. One small agreement compares a hash of every rank's structure (paths, container kinds,
   shapes, dtypes). When all ranks match and the tree holds nothing but tensors (a module, a
   tensor, containers of them), the tensors move at once: step 5.
3. Otherwise the root pickles its tree (non-tensor values, tensor metadata) and broadcasts it.
4. Each other rank lines its own object up against the root's tree: a tensor that must be
   updated in place but differs in shape or dtype is an error, found here, before any tensor
   data moves, and raised on every rank (folded into the next agreement).
5. The tensors travel coalesced (large ones alone and in place, small ones packed into a few
   flat byte buffers; relocated parameters packed whatever their size), straight into the
   existing tensors or into new ones where a rank lacks them; then containers are rebuilt and
   optimizers and schedulers load the root's state.
"""

from __future__ import annotations

import pickle
import weakref

import torch
from torch import nn

from .._core import C, parse_root
from ..runtime.entry import entry_point
from ..runtime.groups import on_group
from ._apply import _Planner
from ._walk import (
    _NONE,
    _RUNTIME,
    _TYPE,
    _Flattener,
    _module_walk,
    _pickle_error,
    _SyncError,
)

__all__ = ["synchronize_"]

#: Small tensors are packed into flat buffers of at most this many bytes.
DEFAULT_BUCKET_BYTES = 64 << 20
#: Tensors of at least this many bytes are broadcast alone, from and into their own memory:
#: above it one more call costs less than copying the bytes in and out of a packed buffer.
DEFAULT_DIRECT_BYTES = 64 << 10


# Modules passed to synchronize_: the standard recipe syncs the model before it builds the
# optimizer, so this is how a DistributedOptimizer without module= finds buffers to watch.
synchronized_modules: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()


def note_synchronized_module(module: torch.nn.Module) -> None:
    """Remember a module passed to synchronize_ (weakly)."""
    try:
        synchronized_modules.add(module)
    except TypeError:  # not weakly referenceable
        pass


def _root_index(root_rank):
    root, error = parse_root(root_rank)
    return (root, None) if not error else (-1, _SyncError(_TYPE, error))


@entry_point("synchronize_()")
def synchronize_(
    obj,
    root_rank: int = 0,
    *,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    direct_bytes: int = DEFAULT_DIRECT_BYTES,
    relocate: bool = True,
    group=None,
):
    """Bring ``obj`` on every rank to root_rank's value and return it. A collective.

    Updated in place: tensors, ``nn.Module`` parameters and buffers, tensors inside dicts,
    lists, tuples, namedtuples and dataclasses, optimizer state (also state that only the
    root has, without taking any optimizer step), LR schedulers, ``torch.amp.GradScaler`` and
    ``torch.Generator`` states. Immutable containers are rebuilt around the same tensors.
    Anything else that pickles (numbers, str, bytes, None, ...) comes back as the root's
    value. Keep the return value: ``x = fm.synchronize_(x)``. How the tensors travel (packed
    buckets, flat storage): the guide's [synchronize_][synchronize_-guide] page.

    Args:
        obj: what to synchronize: a model, an optimizer, a scheduler, a tensor, a generator,
            containers of these, or any value that pickles.
        root_rank: the rank whose value every rank takes (with ``group``, a rank of the group).
        bucket_bytes: small tensors travel packed into flat buffers of at most this many bytes.
        direct_bytes: tensors of at least this many bytes are broadcast alone, in place.
        relocate: True: on the first call, move CPU parameters into one flat storage per
            buffer, so that later calls broadcast it without packing; False: leave storages.
        group: a [`Group`][fluxmpi_py.Group]: bring its members to the root's value (a rank
            outside it gets a ValueError); None: every rank.

    Returns:
        ``obj`` with root_rank's values (keep it: immutable containers are rebuilt).

    Raises:
        ValueError: on every rank, before any data moves, for a tensor whose shape or dtype
            differs from the root's (naming its path: ``fc.weight: shape (10, 5) on rank 1,
            (10, 4) on root 0``), or a root_rank out of range.
        TypeError: on every rank, for an object the root cannot send (naming path and type).

    Examples:
        >>> import torch, fluxmpi_py as fm; fm.Init()
        >>> model = torch.nn.Linear(4, 2)
        >>> model = fm.synchronize_(model, root_rank=0)   # every rank now has rank 0's weights
        >>> fm.synchronize_(fm.local_rank())              # the root's value: 0
        0
        >>> fm.synchronize_({"step": 3, "w": torch.ones(2)})["step"]
        3
    """
    with on_group(group, "synchronize_()"):  # a rank outside the group raises here
        return _synchronize(obj, root_rank, bucket_bytes, direct_bytes, relocate)


# (bucket_bytes, direct_bytes, relocate) -> its C.CoalescedOptions, made once: building the two
# keyword objects cost a few us of every call. Never modified once made.
_options: dict = {}


def _options_of(bucket_bytes: int, direct_bytes: int, relocate: bool):
    key = (bucket_bytes, direct_bytes, relocate)
    options = _options.get(key)
    if options is None:
        options = C.CoalescedOptions(
            plan=C.BroadcastPlanOptions(bucket_bytes=bucket_bytes, direct_bytes=direct_bytes),
            relocate=relocate,
        )
        if len(_options) < 64:  # a program passes a few; never grow without bound
            _options[key] = options
    return options


def _synchronize(obj, root_rank, bucket_bytes, direct_bytes, relocate):
    root, err = _root_index(root_rank)
    try:
        bucket_bytes, direct_bytes = int(bucket_bytes), int(direct_bytes)
    except (TypeError, ValueError):
        err = err or _SyncError(_TYPE, "bucket_bytes and direct_bytes must be ints")
        bucket_bytes = direct_bytes = 1
    options = _options_of(bucket_bytes, direct_bytes, bool(relocate))
    if isinstance(obj, nn.Module):
        note_synchronized_module(obj)  # lets DistributedOptimizer warn about unsynced buffers
    if err is None and isinstance(obj, nn.Module):
        # The common case, synchronize_(model), straight from the cached walk: no tree, and no
        # per-parameter Python work on a call whose module still holds the same tensors.
        try:
            walk = _module_walk(obj)
        except Exception:  # noqa: BLE001 - the full walk below names the problem
            walk = None
        if walk is not None:
            if C.sync_fast_path(walk.ctensors(), root, walk.structure_hash(), options):
                return obj
            # The ranks' structures differ: every rank is now on the slow path below.
            return _slow_path(obj, C.current_group().rank, root, options)
    rank = C.current_group().rank
    flat, tree = _Flattener(), None
    if err is None:
        flat, tree, err = _walk(obj)
    cls, text = (err.cls, err.msg) if err else (_NONE, "")
    tensors = C.TensorList(flat.tensors if err is None else [])
    if C.sync_fast_path(
        tensors,
        root,
        flat.structure_hash(),
        options,
        needs_skeleton=not flat.pure,
        error_class=cls,
        error_text=text,
    ):
        if rank != root:
            for gen, i in flat.generators:
                gen.set_state(flat.tensors[i])
        return obj
    return _slow_path(obj, rank, root, options, flat, tree)


def _walk(obj):
    """(flattener, tree, error): this rank's walk, with any failure as a _SyncError to carry
    into the next agreement."""
    flat = _Flattener()
    try:
        return flat, flat.visit(obj), None
    except _SyncError as e:
        return flat, None, e
    except Exception as e:  # noqa: BLE001 - e.g. a state_dict() that fails on one rank
        return (
            flat,
            None,
            _SyncError(_RUNTIME, f"walking the object failed: {type(e).__name__}: {e}"),
        )


def _slow_path(obj, rank, root, options, flat=None, tree=None):
    """The root's tree travels, then every rank lines up against it."""
    if flat is None:
        flat, tree, err = _walk(obj)
        if err is not None:
            # Every rank reaches the skeleton stage: fail there, on every rank.
            C.broadcast_bytes(None, root, error_class=err.cls, error_text=err.msg)
            raise AssertionError("unreachable: the agreement raises")  # pragma: no cover
    payload, err = None, None
    if rank == root:
        try:
            payload = pickle.dumps((tree, flat.leaf_meta()), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # noqa: BLE001 - name the part that does not pickle
            err = _pickle_error(tree, "", e)
    cls, text = (err.cls, err.msg) if err else (_NONE, "")
    data = C.broadcast_bytes(payload, root, error_class=cls, error_text=text)
    if rank == root:
        C.coalesced_broadcast(flat.tensors, root, options)
        return obj
    planner, err = None, None
    try:
        root_tree, meta = pickle.loads(data)
        planner = _Planner(meta, rank, root)
        planner.plan(root_tree, obj)
    except _SyncError as e:
        err = e
    except Exception as e:  # noqa: BLE001 - e.g. the root's classes do not import here
        err = _SyncError(_RUNTIME, f"reading the root's objects failed: {type(e).__name__}: {e}")
    cls, text = (err.cls, err.msg) if err else (_NONE, "")
    C.coalesced_broadcast(
        planner.targets if err is None else [], root, options, error_class=cls, error_text=text
    )
    return planner.rebuild(root_tree, obj)
