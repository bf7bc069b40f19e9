"""The wrapped optimizer's own step raising on one rank (a bad value in that rank's
``param_groups``, a hook of the optimizer's): after the gradient reduction, so the other ranks
have applied theirs, and the ranks' parameters may now differ without a sign.

That rank raises its own exception at once (nothing waits for it there), after running the
checks that follow every step on every rank (``check_every``: the ranks count steps alike).
It also notes the failure, and the next step's reduction carries it (the byte in the step's
last allreduce, or the step's agreement: no collective of its own): every rank's next
``step()`` (or ``synchronize()``) raises, naming that rank and its exception, and says how to
bring the ranks back together. That step is applied on no rank.

A closure (``step(closure)``) that raises on one rank is that rank's error in the reduction of
its evaluation, where the others wait: they raise it there, naming the rank, and that rank its
own exception.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .._core import C
from ..collectives.inplace import allreduce_
from ..runtime.agreement import mark_raised_on_every_rank, raised_on_every_rank

#: What every rank is told at the next step (after "DistributedOptimizer.step(): rank R: ").
WRAPPED_FAILED = (
    "its wrapped optimizer's step() raised at the previous step ({error}), where other ranks "
    "may have applied theirs: the ranks' parameters and optimizer state may now differ. "
    "Bring them back to one rank's (fm.synchronize_(model) and fm.synchronize_(optimizer), "
    "or load a checkpoint) and go on; this step was applied on no rank"
)


class FailedSteps:
    """The wrapped step and the checks after it, for :class:`fluxmpi_py.DistributedOptimizer`
    (a mixin: the attributes are the optimizer's)."""

    _broken: Exception | None
    _pass_end: Any
    _reduce: Callable[..., None]
    _step_and_sync_buffers: Callable[[Any], Any]
    _checks: Any
    _named: Callable[[], Any]
    param_groups: Any
    optimizer: Any

    def _apply(self, closure):
        """Step the wrapped optimizer (and sync the buffers), then run the checks due; where
        the wrapped step raised on this rank alone, note it for the next step (see the
        module's docstring) and raise it here after the checks."""
        try:
            result = self._step_and_sync_buffers(closure)
        except Exception as e:
            if raised_on_every_rank(e):
                raise
            if C.current_group().size > 1 and self._broken is None:
                self._broken = RuntimeError(WRAPPED_FAILED.format(error=f"{type(e).__name__}: {e}"))
            try:
                self._checked(None)  # as on the other ranks
            except Exception as check:  # raised on every rank: the others see it
                raise e from check  # this rank's own error, after the check's
            raise
        return self._checked(result)

    def _reduced(self, closure: Callable) -> Callable:
        """``closure`` for the wrapped step: every evaluation's gradients are reduced and its
        loss averaged over the ranks; an evaluation that raises on this rank alone raises on
        every rank, in its reduction."""

        def reduced_closure():
            try:
                with torch.enable_grad():
                    loss = closure()
            except Exception as e:
                if raised_on_every_rank(e):
                    raise
                self._pass_end = None  # a backward in it that raised: settled by this reduction
                try:  # the others raise this verdict
                    self._reduce(RuntimeError(f"its closure raised {type(e).__name__}: {e}"))
                except Exception as verdict:
                    if not raised_on_every_rank(verdict):
                        raise
                mark_raised_on_every_rank(e)
                raise  # this rank raises its own
            self._reduce()
            if isinstance(loss, torch.Tensor):
                loss = allreduce_(loss.detach().clone(), "average")
            return loss

        return reduced_closure

    def _checked(self, result):
        """The checks due after this step (check_every; the first step's, unless 0)."""
        self._checks.after_step(self.param_groups, self.optimizer, self._named)
        return result
