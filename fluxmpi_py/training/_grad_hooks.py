"""DistributedOptimizer's part in backward: a post-accumulate hook per parameter hands its
gradient to the reduction (the compiled reducer, or the exact sums of ``deterministic=True``),
and a callback at the end of each backward pass counts the passes of the step (a pass that
raised before that end: :mod:`._abandoned_pass`).

A hook runs on its rank alone while the other ranks' buckets go on, so nothing here raises on
one rank: a gradient that rank cannot reduce is noted by the reduction, reduced as zeros, and
raised at ``step()`` on every rank (csrc/ops/gradient_reducer.h, ``ExactSum.took``).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ._abandoned_pass import AbandonedPasses


class GradHooks(AbandonedPasses):
    """The hooks of :class:`fluxmpi_py.DistributedOptimizer` (a mixin: the attributes are the
    optimizer's)."""

    _handles: list
    _plan: Any
    _reducer: Any
    _exact: Any
    _sync_enabled: bool
    _passes: int
    _passes_per_step: int
    _pass_weight: float
    _join: Any
    _join_count: Any
    _join_round: Callable[[], None]

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
            end = self._pass_end
            if end is None or end() is None:  # the pass's first hook
                self._open_pass(param)
            assert self._exact is not None
            self._exact.add(index, self._last_pass())

        return hook

    def _make_hook(self, index: int) -> Callable:
        reducer_ref = self  # the hook must see the reducer of a later plan

        def hook(param: torch.Tensor) -> None:
            end = reducer_ref._pass_end
            if end is None or end() is None:  # the pass's first hook
                reducer_ref._open_pass(param)
            if (
                reducer_ref._sync_enabled
                and reducer_ref._passes + 1 >= reducer_ref._passes_per_step
            ):
                if reducer_ref._join is not None and not reducer_ref._join_count:
                    reducer_ref._join_round()  # before this step's first bucket (a collective)
                error = ""
                try:
                    if reducer_ref._pass_weight != 1.0 and param.grad is not None:
                        param.grad.mul_(reducer_ref._pass_weight)  # an uneven share of M
                except Exception as e:  # noqa: BLE001 - this rank's alone: step() raises it
                    error = f"{type(e).__name__}: {e}"
                if error:
                    reducer_ref._reducer.mark_ready(index, error)
                else:
                    reducer_ref._reducer.mark_ready(index)

        return hook

    def _end_of_backward(self) -> None:
        self._pass_end = None
        if self._exact is not None:
            self._exact.end_pass(self._last_pass())
        if self._sync_enabled:
            self._passes += 1
