"""DistributedOptimizer's backward hooks: each parameter's post-accumulate hook hands its
gradient to the reduction (the C++ reducer, or the exact sums of ``deterministic=True``) in
the step's last backward pass, and a callback at the end of each pass counts the passes."""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..runtime.groups import on_group
from .join import round_


class BackwardHooks:
    """What DistributedOptimizer runs during backward; its ``_build`` plans and calls
    :meth:`_hook`."""

    _handles: list[torch.utils.hooks.RemovableHandle]
    _plan: Any
    _reducer: Any
    _exact: Any
    _group: Any
    _join: Any
    _join_count: int
    _passes: int
    _passes_per_step: int
    _pass_hooked: bool
    _pass_weight: float
    _sync_enabled: bool

    def _hook(self, order) -> None:
        for h in self._handles:
            h.remove()
        self._reducer = self._plan.reducer
        make = self._make_hook if self._exact is None else self._make_exact_hook
        self._handles = [p.register_post_accumulate_grad_hook(make(i)) for i, p in enumerate(order)]

    def _last_pass(self) -> bool:
        return self._sync_enabled and self._passes + 1 >= self._passes_per_step

    def _make_exact_hook(self, index: int) -> Callable:
        def hook(param: torch.Tensor) -> None:
            if not self._pass_hooked:
                self._pass_hooked = True
                torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
            assert self._exact is not None
            self._exact.add(index, self._last_pass())

        return hook

    def _make_hook(self, index: int) -> Callable:
        reducer_ref = self  # the hook must see the reducer of a later plan

        def hook(param: torch.Tensor) -> None:
            if not reducer_ref._pass_hooked:
                reducer_ref._pass_hooked = True
                torch.autograd.Variable._execution_engine.queue_callback(
                    reducer_ref._end_of_backward
                )
            if (
                reducer_ref._sync_enabled
                and reducer_ref._passes + 1 >= reducer_ref._passes_per_step
            ):
                if reducer_ref._join is not None and not reducer_ref._join_count:
                    reducer_ref._join_round()  # before this step's first bucket
                if reducer_ref._pass_weight != 1.0 and param.grad is not None:
                    param.grad.mul_(reducer_ref._pass_weight)  # an uneven share of M
                reducer_ref._reducer.mark_ready(index)

        return hook

    def _end_of_backward(self) -> None:
        self._pass_hooked = False
        if self._exact is not None:
            self._exact.end_pass(self._last_pass())
        if self._sync_enabled:
            self._passes += 1

    def _join_round(self) -> None:
        """Inside a join: this step's round, as an active rank (a tiny collective)."""
        assert self._join is not None  # called inside a Join only
        state, index = self._join
        with on_group(self._group, "DistributedOptimizer.step()"):  # backward's hook: no group
            self._join_count = round_(state, index)
