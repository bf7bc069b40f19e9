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
   flat byte buffers), straight into the existing tensors or into new ones where a rank lacks
   them; then containers are rebuilt and optimizers and schedulers load the root's state.
"""
from __future__ import annotations

import dataclasses
import hashlib
import operator
import pickle
from collections import defaultdict

import torch
from torch import nn

from ._loader import C

__all__ = ["synchronize_"]

#: Small tensors are packed into flat buffers of at most this many bytes.
DEFAULT_BUCKET_BYTES = 64 << 20
#: Tensors of at least this many bytes are broadcast alone, from and into their own memory.
DEFAULT_DIRECT_BYTES = 1 << 20

# Error classes understood by the compiled agreement (ops/consensus.h: ErrorClass).
_NONE, _VALUE, _TYPE, _RUNTIME = 0, 1, 2, 3
_MISSING = object()


class _SyncError(Exception):
    """A local problem, carried into the next agreement so that every rank raises it."""

    def __init__(self, cls: int, msg: str):
        super().__init__(msg)
        self.cls = cls
        self.msg = msg


def _show(path: str) -> str:
    return path or "obj"


def _key_path(path: str, key) -> str:
    if isinstance(key, str) and key.isidentifier():
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]"


def _attr_path(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _type_name(x) -> str:
    t = type(x)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _is_optimizer(x) -> bool:
    # torch optimizers and wrappers that look like them (fluxmpi_py's DistributedOptimizer).
    return isinstance(x, torch.optim.Optimizer) or (
        hasattr(x, "param_groups") and callable(getattr(x, "state_dict", None))
        and callable(getattr(x, "load_state_dict", None)) and hasattr(x, "state")
    )


def _is_stateful(x) -> bool:
    # LR schedulers, GradScaler and anything else that saves and loads its state.
    return not isinstance(x, type) and callable(getattr(x, "state_dict", None)) and callable(
        getattr(x, "load_state_dict", None))


def _scaler_enabled(x):
    return x.is_enabled() if isinstance(x, torch.amp.GradScaler) else None


class _Flattener:
    """Walks one rank's object into (tree, tensor leaves). Runs on every rank.

    Tree nodes are tuples tagged by their first item:
      ("T", i)                      tensor leaf i
      ("G", i)                      torch.Generator whose state is leaf i
      ("M", first, names)           nn.Module: leaves first.. first+len(names)-1
      ("O", sd, param_meta, sizes)  optimizer: its state_dict's tree, params' shapes and dtypes
      ("S", sd, scaler_enabled)     object with state_dict/load_state_dict (scheduler, scaler)
      ("D", cls, default_factory, [(key, node)])   dict and subclasses
      ("L", [node]) list; ("U", [node]) tuple; ("N", cls, fields, [node]) namedtuple
      ("C", cls, frozen, [(field, node)])          dataclass instance
      ("V", value)                  anything else: the root's value wins (pickled)
    """

    def __init__(self):
        self.tensors = []
        self.paths = []
        self.strict = []     # leaf must be updated in place (its shape must match the root's)
        self.tokens = []     # structure, for the cross-rank hash
        self.generators = []
        self.pure = True     # no non-tensor value needs the root's copy
        self._strict = True
        self._active = set()

    def leaf(self, t, path: str):
        if t.layout is not torch.strided:
            raise _SyncError(_TYPE, f"{_show(path)}: tensors with layout {t.layout} cannot be "
                             "synchronized; only dense (strided) tensors can")
        if not (t.is_cpu or t.is_cuda):
            raise _SyncError(_TYPE, f"{_show(path)}: tensors on {t.device} cannot be "
                             "synchronized; expected a CPU or CUDA tensor")
        i = len(self.tensors)
        self.tensors.append(t)
        self.paths.append(path)
        self.strict.append(self._strict)
        self.tokens.append(path)
        return ("T", i)

    def visit(self, x, path: str = ""):
        if isinstance(x, torch.Tensor):
            return self.leaf(x, path)
        if isinstance(x, nn.Module):
            return self.module(x, path)
        if isinstance(x, torch.Generator):
            node = self.leaf(x.get_state(), path)
            self.generators.append((x, node[1]))
            self.tokens.append("G")
            return ("G", node[1])
        if _is_optimizer(x):
            return self.optimizer(x, path)
        if _is_stateful(x):
            return self.stateful(x, path)
        t = type(x)
        if isinstance(x, dict) or t is list or t is tuple or hasattr(t, "_fields") and isinstance(
                x, tuple) or dataclasses.is_dataclass(x) and not isinstance(x, type):
            return self.container(x, path)
        self.pure = False
        return ("V", x)

    def module(self, m, path: str):
        # The hot loop of synchronize_(model): leaf() inlined, since a model may have
        # thousands of parameters and this walk is part of every call.
        first = len(self.tensors)
        prefix = f"{path}." if path else ""
        names, tensors, paths, tokens = [], self.tensors, self.paths, self.tokens
        tokens.append("M")
        strided = torch.strided
        for named in (m.named_parameters(), m.named_buffers()):
            for name, t in named:
                p = prefix + name
                if t.layout is not strided or not (t.is_cpu or t.is_cuda):
                    self.leaf(t, p)  # raises, naming the path
                names.append(name)
                tensors.append(t)
                paths.append(p)
                tokens.append(p)
        self.strict.extend([self._strict] * len(names))
        return ("M", first, names)

    def optimizer(self, opt, path: str):
        self.pure = False
        params = [p for g in opt.param_groups for p in g["params"]]
        meta = [(tuple(p.shape), p.dtype) for p in params]
        sizes = [len(g["params"]) for g in opt.param_groups]
        self.tokens.append("O")
        return ("O", self.visit(opt.state_dict(), path), meta, sizes)

    def stateful(self, x, path: str):
        self.pure = False
        self.tokens.append("S")
        # A scheduler's or scaler's state_dict is a fresh copy that load_state_dict reads:
        # its tensors need not keep their shape, so they may be replaced.
        strict, self._strict = self._strict, False
        try:
            node = self.visit(x.state_dict(), path)
        finally:
            self._strict = strict
        return ("S", node, _scaler_enabled(x))

    def container(self, x, path: str):
        if id(x) in self._active:
            raise _SyncError(_TYPE, f"{_show(path)}: a {_type_name(x)} that contains itself "
                             "cannot be synchronized")
        self._active.add(id(x))
        try:
            t = type(x)
            if isinstance(x, dict):
                self.tokens.append(f"D:{t.__module__}.{t.__qualname__}:{list(x)!r}")
                factory = x.default_factory if isinstance(x, defaultdict) else None
                return ("D", t, factory,
                        [(k, self.visit(v, _key_path(path, k))) for k, v in x.items()])
            if t is list or t is tuple:
                self.tokens.append(f"{t.__name__}:{len(x)}")
                return ("L" if t is list else "U",
                        [self.visit(v, f"{path}[{i}]") for i, v in enumerate(x)])
            if isinstance(x, tuple):  # namedtuple
                self.tokens.append(f"N:{t.__module__}.{t.__qualname__}")
                return ("N", t, t._fields,
                        [self.visit(v, _attr_path(path, f)) for f, v in zip(t._fields, x)])
            self.tokens.append(f"C:{t.__module__}.{t.__qualname__}")
            fields = [f.name for f in dataclasses.fields(x)]
            return ("C", t, t.__dataclass_params__.frozen,
                    [(f, self.visit(getattr(x, f), _attr_path(path, f))) for f in fields])
        finally:
            self._active.discard(id(x))

    def structure_hash(self) -> int:
        digest = hashlib.blake2b("\x1f".join(self.tokens).encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little", signed=True)

    def leaf_meta(self):
        return [(p, tuple(t.shape), t.dtype, t.device.type, s, isinstance(t, nn.Parameter),
                 t.requires_grad)
                for p, t, s in zip(self.paths, self.tensors, self.strict)]


def _children(node, path: str):
    """(path, child) pairs of a tree node, for walking the tree again (root only)."""
    tag = node[0]
    if tag == "D":
        return [(_key_path(path, k), c) for k, c in node[3]]
    if tag in ("L", "U"):
        return [(f"{path}[{i}]", c) for i, c in enumerate(node[1])]
    if tag == "N":
        return [(_attr_path(path, f), c) for f, c in zip(node[2], node[3])]
    if tag == "C":
        return [(_attr_path(path, f), c) for f, c in node[3]]
    if tag in ("O", "S"):
        return [(path, node[1])]
    return []


def _pickle_error(node, path: str, err: Exception) -> _SyncError:
    """Find the first part of the root's tree that does not pickle, to name it."""
    def bad(x):
        try:
            pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL)
            return None
        except Exception as e:  # noqa: BLE001 - any pickling failure is the answer
            return e

    stack = [(path, node)]
    while stack:
        p, n = stack.pop()
        tag = n[0]
        # Values, and the classes and default factories that rebuild containers, are pickled.
        parts = [n[1]] if tag in ("V", "N", "C") else [n[1], n[2]] if tag == "D" else []
        for what in parts:
            e = bad(what)
            if e is not None:
                kind = (f"class {what.__module__}.{what.__qualname__}" if isinstance(what, type)
                        else f"an object of type {_type_name(what)}")
                return _SyncError(_TYPE, f"{_show(p)}: cannot synchronize {kind}: it is not a "
                                  f"tensor, module, optimizer, container or picklable value ({e})")
        stack.extend(reversed(_children(n, p)))
    return _SyncError(_TYPE, f"{_show(path)}: cannot pickle the root's objects: {err}")


def _shape(s) -> str:
    return str(tuple(s))


class _Planner:
    """On a non-root rank: line the local object up against the root's tree (plan), then,
    after the tensors have moved, return the synchronized object (rebuild)."""

    def __init__(self, meta, rank: int, root: int):
        self.meta = meta
        self.rank = rank
        self.root = root
        self.targets = [None] * len(meta)

    def _where(self, mine, roots) -> str:
        return f"{mine} on rank {self.rank}, {roots} on root {self.root}"

    def _fail(self, cls: int, path: str, msg: str):
        raise _SyncError(cls, f"{_show(path)}: {msg}")

    def _kind_error(self, path: str, expected: str, x):
        got = "nothing" if x is _MISSING else _type_name(x)
        self._fail(_TYPE, path, self._where(got, expected))

    def _differs(self, t, shape, dtype, device):
        if tuple(t.shape) != shape:
            return self._where(f"shape {_shape(t.shape)}", _shape(shape))
        if t.dtype != dtype:
            return self._where(f"dtype {t.dtype}", dtype)
        if t.device.type != device:
            return self._where(f"device {t.device.type}", device)
        return None

    def tensor(self, i: int, x, path: str):
        _, shape, dtype, device, strict, _, _ = self.meta[i]
        if isinstance(x, torch.Tensor) and x.layout is torch.strided:
            bad = self._differs(x, shape, dtype, device)
            if bad is None:
                self.targets[i] = x
                return
            if strict:
                self._fail(_VALUE, path, bad)
        dev = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else device
        self.targets[i] = torch.empty(shape, dtype=dtype, device=dev)

    def plan(self, node, x, path: str = ""):
        tag = node[0]
        if tag == "T":
            self.tensor(node[1], x, path)
        elif tag == "G":
            if not isinstance(x, torch.Generator):
                self._kind_error(path, "torch.Generator", x)
            self.tensor(node[1], x.get_state(), path)
        elif tag == "M":
            self.plan_module(node, x, path)
        elif tag == "O":
            self.plan_optimizer(node, x, path)
        elif tag == "S":
            if not _is_stateful(x):
                self._kind_error(path, "an object with state_dict/load_state_dict", x)
            enabled = _scaler_enabled(x)
            if node[2] is not None and enabled != node[2]:
                self._fail(_VALUE, path, self._where(f"GradScaler(enabled={enabled})",
                                                     f"GradScaler(enabled={node[2]})"))
            self.plan(node[1], x.state_dict(), path)
        elif tag == "D":
            xd = x if isinstance(x, dict) else {}
            for k, child in node[3]:
                self.plan(child, xd.get(k, _MISSING), _key_path(path, k))
        elif tag in ("L", "U"):
            xs = x if isinstance(x, (list, tuple)) else ()
            for i, child in enumerate(node[1]):
                self.plan(child, xs[i] if i < len(xs) else _MISSING, f"{path}[{i}]")
        elif tag == "N":
            xs = x if isinstance(x, tuple) else ()
            for i, (f, child) in enumerate(zip(node[2], node[3])):
                self.plan(child, xs[i] if i < len(xs) else _MISSING, _attr_path(path, f))
        elif tag == "C":
            ok = dataclasses.is_dataclass(x) and not isinstance(x, type)
            for f, child in node[3]:
                self.plan(child, getattr(x, f, _MISSING) if ok else _MISSING, _attr_path(path, f))

    def plan_module(self, node, x, path: str):
        if not isinstance(x, nn.Module):
            self._kind_error(path, "nn.Module", x)
        _, first, names = node
        local = dict(x.named_parameters())
        local.update(x.named_buffers())
        for j, name in enumerate(names):
            p = _attr_path(path, name)
            t = local.pop(name, _MISSING)
            if t is _MISSING:
                self._fail(_VALUE, p, self._where("missing", f"shape {_shape(self.meta[first + j][1])}"))
            self.tensor(first + j, t, p)
        if local:
            name = next(iter(local))
            self._fail(_VALUE, _attr_path(path, name),
                       f"present on rank {self.rank} but not on root {self.root}")

    def plan_optimizer(self, node, x, path: str):
        if not _is_optimizer(x):
            self._kind_error(path, "an optimizer", x)
        _, sd_node, meta, sizes = node
        mine = [len(g["params"]) for g in x.param_groups]
        if mine != sizes:
            self._fail(_VALUE, _attr_path(path, "param_groups"),
                       self._where(f"group sizes {mine}", sizes))
        params = [p for g in x.param_groups for p in g["params"]]
        pos = [(g, k) for g, n in enumerate(sizes) for k in range(n)]
        for p, (shape, dtype), (g, k) in zip(params, meta, pos):
            bad = self._differs(p, shape, dtype, p.device.type)
            if bad is not None:
                self._fail(_VALUE, f"{_attr_path(path, 'param_groups')}[{g}].params[{k}]", bad)
        self.plan(sd_node, x.state_dict(), path)

    def rebuild(self, node, x):
        tag = node[0]
        if tag == "T":
            i = node[1]
            t = self.targets[i]
            if t is x:
                return x
            is_param, requires_grad = self.meta[i][5], self.meta[i][6]
            if is_param:
                return nn.Parameter(t, requires_grad=requires_grad)
            return t.requires_grad_(True) if requires_grad else t
        if tag == "G":
            x.set_state(self.targets[node[1]])
            return x
        if tag == "M":
            return x
        if tag in ("O", "S"):
            # Fresh containers around the (in place or new) tensors: load_state_dict copies
            # the structure and keeps tensors that are already on the right device and dtype.
            x.load_state_dict(self.rebuild(node[1], _MISSING))
            return x
        if tag == "V":
            return node[1]
        if tag == "D":
            _, cls, factory, items = node
            xd = x if isinstance(x, dict) else {}
            new = {k: self.rebuild(c, xd.get(k, _MISSING)) for k, c in items}
            if type(x) is cls:
                if list(x) != list(new) or any(x[k] is not v for k, v in new.items()):
                    x.clear()
                    x.update(new)
                return x
            if cls is dict:
                return new
            out = cls.__new__(cls)  # a dict subclass, without running its __init__
            if factory is not None:
                out.default_factory = factory
            dict.update(out, new)
            return out
        if tag in ("L", "U"):
            xs = x if isinstance(x, (list, tuple)) else ()
            new = [self.rebuild(c, xs[i] if i < len(xs) else _MISSING)
                   for i, c in enumerate(node[1])]
            if tag == "L":
                if type(x) is list:
                    x[:] = new
                    return x
                return new
            return x if _same_items(x, tuple, new) else tuple(new)
        if tag == "N":
            cls = node[1]
            xs = x if isinstance(x, tuple) else ()
            new = [self.rebuild(c, xs[i] if i < len(xs) else _MISSING)
                   for i, c in enumerate(node[3])]
            return x if _same_items(x, cls, new) else cls(*new)
        if tag == "C":
            _, cls, frozen, items = node
            ok = type(x) is cls
            new = [(f, self.rebuild(c, getattr(x, f, _MISSING) if ok else _MISSING))
                   for f, c in items]
            if ok and not frozen:
                for f, v in new:
                    setattr(x, f, v)
                return x
            if ok and all(getattr(x, f) is v for f, v in new):
                return x
            out = cls.__new__(cls)  # rebuilt field by field, without running __init__
            for f, v in new:
                object.__setattr__(out, f, v)
            return out
        raise AssertionError(f"unknown node {tag!r}")


def _same_items(x, cls, new) -> bool:
    return type(x) is cls and len(x) == len(new) and all(a is b for a, b in zip(x, new))


def _root_index(root_rank):
    try:
        return operator.index(root_rank), None
    except TypeError:
        return -1, _SyncError(_TYPE, f"root_rank must be an int, got {_type_name(root_rank)}")


def synchronize_(obj, root_rank: int = 0, *, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 direct_bytes: int = DEFAULT_DIRECT_BYTES):
    """Bring ``obj`` on every rank to root_rank's value and return it. A collective.

    Updated in place: tensors, ``nn.Module`` parameters and buffers, tensors inside dicts,
    lists, tuples, namedtuples and dataclasses, optimizer state (also state that only the
    root has, without taking any optimizer step), LR schedulers, ``torch.amp.GradScaler`` and
    ``torch.Generator`` states. Immutable containers are rebuilt around the same tensors.
    Anything else that pickles (numbers, str, bytes, None, ...) comes back as the root's
    value. Keep the return value: ``x = fm.synchronize_(x)``.

    Raises on every rank, before any data moves: ``ValueError`` when a tensor that must be
    updated in place differs from the root's in shape or dtype (the message names its path,
    e.g. ``fc.weight: shape (10, 5) on rank 1, (10, 4) on root 0``) or when root_rank is out
    of range; ``TypeError`` for an object the root cannot send (naming path and type).

    Small tensors travel packed into flat buffers of at most ``bucket_bytes`` bytes; tensors
    of at least ``direct_bytes`` bytes are broadcast alone, from and into their own memory.

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> model = torch.nn.Linear(4, 2)
    >>> model = fm.synchronize_(model, root_rank=0)   # every rank now has rank 0's weights
    >>> fm.synchronize_(fm.local_rank())              # the root's value: 0
    0
    >>> fm.synchronize_({"step": 3, "w": torch.ones(2)})["step"]
    3
    """
    rank = C.rank()
    root, err = _root_index(root_rank)
    try:
        bucket_bytes, direct_bytes = int(bucket_bytes), int(direct_bytes)
    except (TypeError, ValueError):
        err = err or _SyncError(_TYPE, "bucket_bytes and direct_bytes must be ints")
        bucket_bytes = direct_bytes = 1
    flat = _Flattener()
    tree = None
    if err is None:
        try:
            tree = flat.visit(obj)
        except _SyncError as e:
            err = e
        except Exception as e:  # noqa: BLE001 - e.g. a state_dict() that fails on one rank
            err = _SyncError(_RUNTIME, f"walking the object failed: {type(e).__name__}: {e}")
    cls, text = (err.cls, err.msg) if err else (_NONE, "")
    tensors = flat.tensors if err is None else []
    if C.sync_fast_path(tensors, root, flat.structure_hash(), not flat.pure, cls, text,
                        bucket_bytes, direct_bytes):
        if rank != root:
            for gen, i in flat.generators:
                gen.set_state(flat.tensors[i])
        return obj

    # Slow path: the root's tree travels, then every rank lines up against it.
    payload, err = None, None
    if rank == root:
        try:
            payload = pickle.dumps((tree, flat.leaf_meta()), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # noqa: BLE001 - name the part that does not pickle
            err = _pickle_error(tree, "", e)
    cls, text = (err.cls, err.msg) if err else (_NONE, "")
    data = C.broadcast_bytes(payload, root, cls, text)
    if rank == root:
        C.coalesced_broadcast(flat.tensors, root, _NONE, "", bucket_bytes, direct_bytes)
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
    C.coalesced_broadcast(planner.targets if err is None else [], root, cls, text,
                          bucket_bytes, direct_bytes)
    return planner.rebuild(root_tree, obj)
