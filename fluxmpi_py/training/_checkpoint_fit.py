"""load_checkpoint's checks that an entry fits its target whole, made on every rank before
any target is touched (so that a load that fails leaves every target as it was)."""

from __future__ import annotations

from typing import Any

import torch


def _shape(t: torch.Tensor) -> str:
    return str(tuple(t.shape))


def _dtype_fits(saved: torch.dtype, own: torch.dtype) -> bool:
    """Loading converts floating point to floating point (as load_state_dict does); any
    other pair must be the same dtype."""
    return saved == own or (saved.is_floating_point and own.is_floating_point)


def _tensor_misfit(key: str, saved: Any, own: torch.Tensor) -> str | None:
    if not isinstance(saved, torch.Tensor):
        return f"{key} is a {type(saved).__name__} in the checkpoint, a tensor here"
    if torch.nn.parameter.is_lazy(own):
        return None  # an uninitialized lazy parameter takes any shape
    if saved.shape != own.shape:
        return f"{key} has shape {_shape(saved)} in the checkpoint, {_shape(own)} here"
    if not _dtype_fits(saved.dtype, own.dtype):
        return f"{key} has dtype {saved.dtype} in the checkpoint, {own.dtype} here"
    return None


def _module_misfits(saved: Any, module: torch.nn.Module) -> list[str]:
    if not isinstance(saved, dict):
        return [f"the entry is a {type(saved).__name__}, not a state dict"]
    own = module.state_dict()
    out = []
    missing = [k for k in own if k not in saved]
    unexpected = [k for k in saved if k not in own]
    if missing:
        out.append(f"missing keys {missing}")
    if unexpected:
        out.append(f"unexpected keys {unexpected}")
    for k, t in own.items():
        if k in saved and isinstance(t, torch.Tensor):
            misfit = _tensor_misfit(repr(k), saved[k], t)
            if misfit:
                out.append(misfit)
    return [m for m in out if m]


# The per-parameter buffers of torch's optimizers: each has its parameter's shape.
_PER_PARAMETER = frozenset(
    ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer", "square_avg", "acc_delta")
    + ("sum", "exp_inf", "ax", "grad_avg", "prev", "step_size")
)


def _optimizer_misfits(saved: Any, opt: torch.optim.Optimizer) -> list[str]:
    try:
        groups, state = saved["param_groups"], saved["state"]
        counts = [len(g["params"]) for g in groups]
    except (TypeError, KeyError):
        return ["the entry is not an optimizer's state dict (param_groups and state)"]
    own = [g["params"] for g in opt.param_groups]
    if len(groups) != len(own):
        return [f"{len(groups)} parameter groups in the checkpoint, {len(own)} here"]
    out = [
        f"parameter group {i} has {n} parameters in the checkpoint, {len(o)} here"
        for i, (n, o) in enumerate(zip(counts, own))
        if n != len(o)
    ]
    if out:
        return out
    for i, (g, params) in enumerate(zip(groups, own)):
        for j, (pid, p) in enumerate(zip(g["params"], params)):
            entry = state.get(pid, {}) if isinstance(state, dict) else {}
            for name, t in entry.items() if isinstance(entry, dict) else ():
                if name in _PER_PARAMETER and isinstance(t, torch.Tensor) and t.dim() > 0:
                    if t.shape != p.shape:
                        out.append(
                            f"state {name!r} of parameter {j} of group {i} has shape "
                            f"{_shape(t)} in the checkpoint, the parameter {_shape(p)}"
                        )
    return out


def check_fits(name: str, obj: Any, saved: Any, path: str) -> None:
    """Raise ValueError when entry ``saved`` cannot be loaded into target ``obj`` whole.
    Checked: tensors, modules and optimizers; other targets are only loaded."""
    if isinstance(obj, torch.Tensor):
        misfit = _tensor_misfit(repr(name), saved, obj)
        misfits = [misfit] if misfit else []
    elif isinstance(obj, torch.nn.Module):
        misfits = _module_misfits(saved, obj)
    elif isinstance(obj, torch.optim.Optimizer):
        misfits = _optimizer_misfits(saved, obj)
    else:
        return
    if misfits:
        shown = "; ".join(misfits[:5]) + (
            f"; and {len(misfits) - 5} more" if len(misfits) > 5 else ""
        )
        raise ValueError(
            f"load_checkpoint: {name}= does not fit the entry {name!r} of {path!r}: {shown}; "
            "nothing was loaded"
        )


def load_order(targets: dict) -> list:
    """Targets that check_fits cannot check load first: if one of them fails, the checked
    ones (which cannot) are still untouched."""
    checked = (torch.Tensor, torch.nn.Module, torch.optim.Optimizer)
    return sorted(targets.items(), key=lambda kv: isinstance(kv[1], checked))
