"""What :class:`DistributedOptimizer` checks after its steps (``check_every``).

After the first step, unless ``check_every=0``: do the ranks hold the same parameters? Ranks
that start from different parameters (no :func:`synchronize_` after building or loading the
model) would each apply the same averaged gradients to their own weights and train different
models without a sign. Every ``check_every``-th step: :func:`check_consistency` over the
parameters (the whole module when given) and the optimizer's state. Each check is one pass over
those bytes and one tiny allreduce; a difference raises ValueError on every rank together.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable

import torch

from ._reduction_plan import named_candidates
from .consistency import _check as _check_consistency


class StepChecks:
    """The checks after each ``step()`` of one optimizer.

    ``unequal_start``: what the first step's check does when the ranks' parameters differ,
    "raise" or "warn" (hvd.DistributedOptimizer: Horovod lets such a step run); ``remedy``
    is what its message tells the user to do.
    """

    def __init__(
        self,
        every: int | None,
        module: torch.nn.Module | None,
        names: dict[int, str],
        *,
        unequal_start: str,
        remedy: str,
    ):
        self.every = every
        self.steps = 0  # step() calls so far
        self._module = module
        self._names = names
        self._unequal_start = unequal_start
        self._remedy = remedy

    def after_step(
        self,
        param_groups: list[dict],
        optimizer: torch.optim.Optimizer,
        named: Callable[[], Iterable[tuple[str, torch.Tensor]]],
    ) -> None:
        """Count a step, and run the checks it is due (the same on every rank: the steps are
        counted the same, a joined rank's shadow step included)."""
        self.steps += 1
        every = self.every
        if self.steps == 1 and every != 0 and (every is None or every > 1):
            self._check_first_step(param_groups)
        if not every or self.steps % every:
            return
        names = dict(self._names)
        if self._module is not None:
            names.update({id(p): f"model.{n}" for n, p in self._module.named_parameters()})
            checked = {"model": self._module, "optimizer": optimizer}
        else:
            checked = {"parameters": dict(named()), "optimizer": optimizer}
        _check_consistency(
            checked,
            names,
            f"DistributedOptimizer(check_every={every}) after step {self.steps}",
        )

    def _check_first_step(self, param_groups: list[dict]) -> None:
        names = dict(self._names)
        if self._module is not None:
            names.update({id(p): n for n, p in self._module.named_parameters()})
        try:
            _check_consistency(
                {"parameters": dict(named_candidates(param_groups, names))},
                names,
                "DistributedOptimizer: after its first step the ranks must hold the same "
                f"parameters (start them equal: {self._remedy}, or the same seed "
                "everywhere; check_every=0 skips this check)",
            )
        except ValueError as e:  # raised on every rank together
            if self._unequal_start == "raise":
                raise
            # step()'s frame: _check_first_step, after_step, _checked, _step, step
            warnings.warn(str(e), RuntimeWarning, stacklevel=5)
