"""The other ranks' half of synchronize_: line the local object up against the root's tree
(plan: find each tensor to write in place or create, and every mismatch, before any data
moves), then, once the tensors have arrived, return the synchronized object (rebuild).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from .._core import C
from ._walk import (
    _MISSING,
    _TYPE,
    _VALUE,
    _attr_path,
    _is_optimizer,
    _is_stateful,
    _key_path,
    _scaler_enabled,
    _show,
    _SyncError,
    _type_name,
)


def _shape(s) -> str:
    return str(tuple(s))


class _Planner:
    """On a non-root rank: line the local object up against the root's tree (plan), then,
    after the tensors have moved, return the synchronized object (rebuild)."""

    def __init__(self, meta, rank: int, root: int):
        self.meta = meta
        self.rank = rank
        self.root = root
        self.targets: list[torch.Tensor | None] = [None] * len(meta)

    def _where(self, mine, roots) -> str:
        return f"{mine} on rank {self.rank}, {roots} on root {self.root}"

    def _fail(self, cls: C.ErrorClass, path: str, msg: str):
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
                self._fail(
                    _VALUE,
                    path,
                    self._where(f"GradScaler(enabled={enabled})", f"GradScaler(enabled={node[2]})"),
                )
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
                self._fail(
                    _VALUE, p, self._where("missing", f"shape {_shape(self.meta[first + j][1])}")
                )
            self.tensor(first + j, t, p)
        if local:
            name = next(iter(local))
            self._fail(
                _VALUE,
                _attr_path(path, name),
                f"present on rank {self.rank} but not on root {self.root}",
            )

    def plan_optimizer(self, node, x, path: str):
        if not _is_optimizer(x):
            self._kind_error(path, "an optimizer", x)
        _, sd_node, meta, sizes = node
        mine = [len(g["params"]) for g in x.param_groups]
        if mine != sizes:
            self._fail(
                _VALUE, _attr_path(path, "param_groups"), self._where(f"group sizes {mine}", sizes)
            )
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
            new = [
                self.rebuild(c, xs[i] if i < len(xs) else _MISSING) for i, c in enumerate(node[1])
            ]
            if tag == "L":
                if type(x) is list:
                    x[:] = new
                    return x
                return new
            return x if _same_items(x, tuple, new) else tuple(new)
        if tag == "N":
            cls = node[1]
            xs = x if isinstance(x, tuple) else ()
            new = [
                self.rebuild(c, xs[i] if i < len(xs) else _MISSING) for i, c in enumerate(node[3])
            ]
            return x if _same_items(x, cls, new) else cls(*new)
        if tag == "C":
            _, cls, frozen, items = node
            ok = type(x) is cls
            new = [
                (f, self.rebuild(c, getattr(x, f, _MISSING) if ok else _MISSING)) for f, c in items
            ]
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
