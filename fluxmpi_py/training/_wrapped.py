"""An optimizer that is a face of another: its ``param_groups``, ``state``, ``state_dict`` and
``zero_grad`` are the wrapped optimizer's, read through at every access.

LR schedulers, checkpoints and :func:`synchronize_` that touch the face touch the real
optimizer. A copy held here would go stale: loading a state dict into the wrapped optimizer
replaces its lists, and schedulers would then change groups that no longer train anything.
"""

from __future__ import annotations

import torch

from ..runtime.entry import local_call


def _read_through(name: str) -> property:
    """An attribute of the wrapped optimizer (``self.optimizer``), read and set through; the
    object's own until it wraps one."""
    own = "_placeholder_" + name

    def get(self):
        inner = self.__dict__.get("optimizer")
        return self.__dict__[own] if inner is None else getattr(inner, name)

    def put(self, value) -> None:
        inner = self.__dict__.get("optimizer")
        if inner is None:
            self.__dict__[own] = value
        else:
            setattr(inner, name, value)

    return property(get, put)


class WrappedOptimizer(torch.optim.Optimizer):
    """Base of :class:`DistributedOptimizer`: call ``_wrap(optimizer)`` instead of
    ``torch.optim.Optimizer.__init__``."""

    def _wrap(self, optimizer: torch.optim.Optimizer) -> None:
        # torch.optim.Optimizer.__init__ needs parameters: a placeholder, left behind at once.
        super().__init__(
            [{"params": [torch.zeros(0, requires_grad=True)]}], dict(optimizer.defaults)
        )
        self.optimizer = optimizer  # from here on, param_groups and state are the optimizer's
        self.defaults = optimizer.defaults

    @local_call
    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    @local_call
    def add_param_group(self, param_group: dict) -> None:
        if not hasattr(self, "optimizer"):  # called by Optimizer.__init__ for the placeholder
            return super().add_param_group(param_group)
        self.optimizer.add_param_group(param_group)

    @local_call
    def state_dict(self):
        return self.optimizer.state_dict()

    @local_call
    def load_state_dict(self, state_dict) -> None:
        self.optimizer.load_state_dict(state_dict)

    # The placeholder's, while Optimizer.__init__ sets it up; then the wrapped optimizer's.
    param_groups = _read_through("param_groups")
    state = _read_through("state")

    def __getstate__(self):
        raise TypeError("DistributedOptimizer cannot be pickled; save its state_dict() instead")
