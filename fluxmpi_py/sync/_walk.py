"""The object walk of synchronize_, run on every rank: one object becomes a tree of tagged
tuples (picklable, so the root's tree can travel) plus its tensor leaves, in a fixed order.
Also the helpers both sides share: paths, error classes, and the kinds of stateful objects.
"""

from __future__ import annotations

import dataclasses
import pickle
import weakref
from collections import defaultdict

import torch
from torch import nn

from .._core import C
from ..runtime.agreement import hash64

# Error classes understood by the compiled agreement (ops/consensus.h: ErrorClass).
_NONE, _VALUE, _TYPE, _RUNTIME = (
    C.ErrorClass.NONE,
    C.ErrorClass.VALUE,
    C.ErrorClass.TYPE,
    C.ErrorClass.RUNTIME,
)
_MISSING = object()


class _SyncError(Exception):
    """A local problem, carried into the next agreement so that every rank raises it."""

    def __init__(self, cls: C.ErrorClass, msg: str):
        super().__init__(msg)
        self.cls = cls
        self.msg = msg


def _shares_memory(t: torch.Tensor) -> bool:
    """Whether elements of ``t`` share memory (a dimension of stride 0 and size > 1, as
    expand() makes): such a tensor cannot be written in place. The root only reads its
    tensors, but the check is the same on every rank, so the outcome does not depend on
    which rank is the root."""
    return not t.is_contiguous() and any(s == 0 and n > 1 for s, n in zip(t.stride(), t.shape))


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
        hasattr(x, "param_groups")
        and callable(getattr(x, "state_dict", None))
        and callable(getattr(x, "load_state_dict", None))
        and hasattr(x, "state")
    )


def _is_stateful(x) -> bool:
    # LR schedulers, GradScaler and anything else that saves and loads its state.
    return (
        not isinstance(x, type)
        and callable(getattr(x, "state_dict", None))
        and callable(getattr(x, "load_state_dict", None))
    )


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
        self.strict = []  # leaf must be updated in place (its shape must match the root's)
        self.tokens = []  # structure, for the cross-rank hash
        self.generators = []
        self.pure = True  # no non-tensor value needs the root's copy
        self._strict = True
        self._active = set()

    def leaf(self, t, path: str):
        if t.layout is not torch.strided:
            raise _SyncError(
                _TYPE,
                f"{_show(path)}: tensors with layout {t.layout} cannot be "
                "synchronized; only dense (strided) tensors can",
            )
        if not (t.is_cpu or t.is_cuda):
            raise _SyncError(
                _TYPE,
                f"{_show(path)}: tensors on {t.device} cannot be "
                "synchronized; expected a CPU or CUDA tensor",
            )
        if _shares_memory(t):  # found on every rank's walk, so every rank raises it
            raise _SyncError(
                _VALUE,
                f"{_show(path)}: the tensor has elements that share memory (e.g. made by "
                "expand()), so it cannot be updated in place; pass a .clone() of it",
            )
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
        namedtuple = isinstance(x, tuple) and hasattr(t, "_fields")
        dataclass = dataclasses.is_dataclass(x) and not isinstance(x, type)
        if isinstance(x, dict) or t is list or t is tuple or namedtuple or dataclass:
            return self.container(x, path)
        self.pure = False
        return ("V", x)

    def module(self, m, path: str):
        first = len(self.tensors)
        walk = _module_walk(m)
        prefix = f"{path}." if path else ""
        names, tensors = walk.names, walk.tensors
        self.tensors.extend(tensors)
        self.paths.extend([prefix + n for n in names] if prefix else names)
        self.tokens.append("M")
        self.tokens.append(prefix)
        self.tokens.append(walk.digest)
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
            raise _SyncError(
                _TYPE,
                f"{_show(path)}: a {_type_name(x)} that contains itself cannot be synchronized",
            )
        self._active.add(id(x))
        try:
            t = type(x)
            if isinstance(x, dict):
                self.tokens.append(f"D:{t.__module__}.{t.__qualname__}:{list(x)!r}")
                factory = x.default_factory if isinstance(x, defaultdict) else None
                return (
                    "D",
                    t,
                    factory,
                    [(k, self.visit(v, _key_path(path, k))) for k, v in x.items()],
                )
            if t is list or t is tuple:
                self.tokens.append(f"{t.__name__}:{len(x)}")
                return (
                    "L" if t is list else "U",
                    [self.visit(v, f"{path}[{i}]") for i, v in enumerate(x)],
                )
            if isinstance(x, tuple):  # namedtuple
                self.tokens.append(f"N:{t.__module__}.{t.__qualname__}")
                return (
                    "N",
                    t,
                    t._fields,
                    [self.visit(v, _attr_path(path, f)) for f, v in zip(t._fields, x)],
                )
            self.tokens.append(f"C:{t.__module__}.{t.__qualname__}")
            fields = [f.name for f in dataclasses.fields(x)]
            return (
                "C",
                t,
                t.__dataclass_params__.frozen,
                [(f, self.visit(getattr(x, f), _attr_path(path, f))) for f in fields],
            )
        finally:
            self._active.discard(id(x))

    def structure_hash(self) -> int:
        return hash64("\x1f".join(self.tokens))

    def leaf_meta(self):
        return [
            (
                p,
                tuple(t.shape),
                t.dtype,
                t.device.type,
                s,
                isinstance(t, nn.Parameter),
                t.requires_grad,
            )
            for p, t, s in zip(self.paths, self.tensors, self.strict)
        ]


class _ModuleWalk:
    """One module's tensor leaves (named_parameters, then named_buffers), with what is needed
    to tell cheaply that the module still holds exactly these: every submodule's parameter,
    buffer and child dicts, by key and by object identity."""

    __slots__ = ("names", "tensors", "digest", "snapshot", "_ctensors", "_hash", "__weakref__")

    def __init__(self, m):
        self.names, self.tensors, self._ctensors, self._hash = [], [], None, None
        strided = torch.strided
        for named in (m.named_parameters(), m.named_buffers()):
            for name, t in named:
                if t.layout is not strided or not (t.is_cpu or t.is_cuda) or _shares_memory(t):
                    _Flattener().leaf(t, name)  # raises, naming the path
                self.names.append(name)
                self.tensors.append(t)
        self.digest = str(hash64("\x1f".join(self.names)))
        # Only the dicts, never the modules that own them: the cache is keyed weakly by the
        # module, so its value must not keep the module alive. (It does keep the tensors alive
        # until the module's next walk replaces it.)
        # With each dict's version tag (CPython < 3.12; -1 elsewhere): an unmodified dict is
        # then recognised without reading its entries.
        version = C.dict_version
        self.snapshot = [
            (d, list(d), list(d.values()), version(d))
            for sub in m.modules()
            for d in (sub._parameters, sub._buffers, sub._modules)
        ]

    def structure_hash(self) -> int:
        """synchronize_(module)'s structure hash, from the cached walk alone."""
        if self._hash is None:  # what _Flattener gives for this module alone
            self._hash = hash64(f"M\x1f\x1f{self.digest}")
        return self._hash

    def ctensors(self):
        """The tensors as one compiled list, converted once per walk."""
        if self._ctensors is None:
            self._ctensors = C.TensorList(self.tensors)
        return self._ctensors


# id(module) -> (weak reference to the module, its last walk). Reused while the module holds
# the same tensors: walking a model of a thousand parameters through named_parameters() costs
# about as much as broadcasting it. The weak reference's callback drops the entry.
_walks: dict = {}
# Classes that change how parameters are listed are walked every time.
_PLAIN_LISTING = (
    nn.Module.named_parameters,
    nn.Module.named_buffers,
    nn.Module.named_modules,
    nn.Module._named_members,
)
_plain_types: dict = {}


def _is_plain(t) -> bool:
    plain = _plain_types.get(t)
    if plain is None:
        plain = _plain_types[t] = (
            t.named_parameters,
            t.named_buffers,
            t.named_modules,
            t._named_members,
        ) == _PLAIN_LISTING
    return plain


def _forget(key):
    return lambda _ref: _walks.pop(key, None)


def _module_walk(m) -> _ModuleWalk:
    plain = _is_plain(type(m))
    if plain:
        entry = _walks.get(id(m))
        if entry is not None and entry[0]() is m and C.dicts_unchanged(entry[1].snapshot):
            return entry[1]
    walk = _ModuleWalk(m)
    if plain:
        try:
            _walks[id(m)] = (weakref.ref(m, _forget(id(m))), walk)
        except TypeError:  # not weakly referenceable
            pass
    return walk


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
                kind = (
                    f"class {what.__module__}.{what.__qualname__}"
                    if isinstance(what, type)
                    else f"an object of type {_type_name(what)}"
                )
                return _SyncError(
                    _TYPE,
                    f"{_show(p)}: cannot synchronize {kind}: it is not a "
                    f"tensor, module, optimizer, container or picklable value ({e})",
                )
        stack.extend(reversed(_children(n, p)))
    return _SyncError(_TYPE, f"{_show(path)}: cannot pickle the root's objects: {err}")
