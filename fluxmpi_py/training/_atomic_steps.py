"""DistributedOptimizer in the shrink mode (``Init(on_failure="shrink")``): a step applied on
every survivor or on none, and the plan made again for the world that :func:`recover` left."""

from __future__ import annotations

from typing import Any

from .._core import C
from ..runtime.entry import entry_point
from ._optimizer_args import check_passes


class AtomicSteps:
    """What DistributedOptimizer adds for lost ranks; its ``_build`` makes the plans."""

    _group: Any
    _passes_per_step: int
    _buffer_sync: Any
    _applied_steps: int
    _pass_end: Any
    _broken: Any
    optimizer: Any

    def _build(self) -> None:  # DistributedOptimizer's
        raise NotImplementedError

    @entry_point("DistributedOptimizer.rebuild()")
    def rebuild(self, *, backward_passes_per_step: int | None = None) -> None:
        """Plan again for the world as it is now, after :func:`fluxmpi_py.recover` shrank it
        (the plan, the exact sums and the buffer sync were made for the old one): a collective
        of the survivors. The wrapped optimizer and its state stay; this step's gradients and
        passes are dropped. ``backward_passes_per_step`` changes the passes per step (a
        survivor's share of the micro-batches, which may differ by one between survivors:
        the plan counts the step's micro-batches over all of them again).

        >>> import torch, fluxmpi_py as fm; fm.Init()
        >>> model = torch.nn.Linear(4, 2)
        >>> opt = fm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        >>> opt.rebuild(backward_passes_per_step=2)
        """
        if self._group is not None:
            raise ValueError(
                "DistributedOptimizer(group=...).rebuild(): a group made before a recovery is "
                "stale; build the optimizer on the world"
            )
        if backward_passes_per_step is not None:
            error = check_passes(backward_passes_per_step)
            if error:
                raise ValueError(f"DistributedOptimizer.rebuild(): {error}")
            self._passes_per_step = backward_passes_per_step
        self.optimizer.zero_grad(set_to_none=True)
        self._passes, self._pass_end, self._synchronized = 0, None, False
        self._broken = None
        self._build()

    def _apply_agreed(self, closure):
        """The shrink mode: a step is atomic across ranks. Every collective of the step first
        (the buffers too, not overlapped), then one agreement, the same on every survivor
        (RanksLostError on all of them when a rank was lost), then the local apply: the
        step is applied on every survivor or on none."""
        if closure is not None:
            raise ValueError(
                "DistributedOptimizer.step(closure) in the shrink mode: a closure makes "
                "collectives inside the wrapped step, which then cannot be atomic"
            )
        if self._buffer_sync is not None:
            self._buffer_sync()
        C.agree_on_world(True)
        self._applied_steps += 1
        return self.optimizer.step()
