"""An optimizer that is a face of another: its ``param_groups``, ``state``, ``state_dict`` and
``zero_grad`` are the wrapped optimizer's, read through at every access.

LR schedulers, checkpoints and :func:`synchronize_` that touch the face touch the real
optimizer. A copy held here would go stale: loading a state dict into the wrapped optimizer
replaces its lists, and schedulers would then change groups that no longer train anything.
"""

from __future__ import annotations

import torch


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

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group: dict) -> None:
        if not hasattr(self, "optimizer"):  # called by Optimizer.__init__ for the placeholder
            return super().add_param_group(param_group)
        self.optimizer.add_param_group(param_group)

    def state_dict(self):
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict) -> None:
        self.optimizer.load_state_dict(state_dict)

    @property
    def param_groups(self):
        inner = self.__dict__.get("optimizer")
        return self.__dict__["_placeholder_groups"] if inner is None else inner.param_groups

    @param_groups.setter
    def param_groups(self, value) -> None:
        inner = self.__dict__.get("optimizer")
        if inner is None:  # Optimizer.__init__ setting up the placeholder
            self.__dict__["_placeholder_groups"] = value
        else:
            inner.param_groups = value

    @property
    def state(self):
        inner = self.__dict__.get("optimizer")
        return self.__dict__["_placeholder_state"] if inner is None else inner.state

    @state.setter
    def state(self, value) -> None:
        inner = self.__dict__.get("optimizer")
        if inner is None:
            self.__dict__["_placeholder_state"] = value
        else:
            inner.state = value

    def __getstate__(self):
        raise TypeError("DistributedOptimizer cannot be pickled; save its state_dict() instead")
