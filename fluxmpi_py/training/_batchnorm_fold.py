"""BatchNorm running statistics folded in the global micro-batch order, for
``DistributedOptimizer(deterministic=True, module=...)``: the same bits at any world size
(the gradients' exact sums: :mod:`.exact_sum`)."""

from __future__ import annotations

from typing import cast

import torch

from ..collectives.rows import allgather

_BN = torch.nn.modules.batchnorm._BatchNorm


def _stats(m: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A tracking BatchNorm's running_mean, running_var and num_batches_tracked."""
    return cast(
        tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        (m.running_mean, m.running_var, m.num_batches_tracked),
    )


class BatchNormFold:
    """BatchNorm running statistics that do not depend on the world size.

    During a training forward each BatchNorm updates copies of its running statistics with
    momentum 1, which makes them that micro-batch's own statistics, and records them; the
    running statistics themselves stay the step's until ``step()``. At ``step()`` the ranks gather every micro-batch's
    statistics in rank order, which is the step's global micro-batch order (each rank holds
    contiguous micro-batches, the first ranks one more where the world size does not divide
    them: the gather takes each rank's own count), and every rank folds them into the running statistics in that
    order, as one process running the micro-batches one after another would:
    ``r = (1 - f) * r + f * b_i`` in float64 with ``f`` the momentum (or ``1 / (n + i + 1)``
    for ``momentum=None``), then rounded once to the buffer's dtype; ``num_batches_tracked``
    grows by the number of micro-batches. The same inputs in the same order: the same bits.
    """

    def __init__(self, module: torch.nn.Module, group):
        self.group = group
        self.mods = [
            m
            for m in module.modules()
            if isinstance(m, _BN) and m.track_running_stats and m.running_mean is not None
        ]
        self.records: dict[int, list[torch.Tensor]] = {id(m): [] for m in self.mods}
        self._saved: dict[int, tuple] = {}
        self.handles = []
        for m in self.mods:
            self.handles.append(m.register_forward_pre_hook(self._before))
            self.handles.append(m.register_forward_hook(self._after))

    def forwards(self) -> tuple[int, int]:
        """(fewest, most) training forwards recorded this step by one BatchNorm."""
        counts = [len(r) for r in self.records.values()] or [0]
        return min(counts), max(counts)

    def _before(self, m, _inputs) -> None:
        if not m.training:
            return
        # The forward updates (and autograd keeps) copies; the step's statistics stay as
        # they are, untouched until step() folds the records into them.
        self._saved[id(m)] = (m.momentum, m.running_mean, m.running_var, m.num_batches_tracked)
        m.running_mean = m.running_mean.clone()
        m.running_var = m.running_var.clone()
        m.num_batches_tracked = m.num_batches_tracked.clone()
        m.momentum = 1.0  # the copies become this micro-batch's own statistics

    def _after(self, m, _inputs, _output) -> None:
        saved = self._saved.pop(id(m), None)
        if saved is None:
            return
        self.records[id(m)].append(
            torch.cat([m.running_mean.to(torch.float64), m.running_var.to(torch.float64)])
        )
        m.momentum, m.running_mean, m.running_var, m.num_batches_tracked = saved

    def finish(self, micro_batches: int) -> None:
        """Gather the step's statistics (every BatchNorm recorded the same number of
        forwards on every rank: the caller checked) and fold them (a collective)."""
        if not self.mods:
            return
        local = torch.cat(
            [
                torch.stack(self.records[id(m)])
                if self.records[id(m)]
                else torch.zeros(0, 2 * _stats(m)[0].numel(), dtype=torch.float64)
                for m in self.mods
            ],
            dim=1,
        )
        self.records = {id(m): [] for m in self.mods}
        rows = allgather(local, group=self.group)  # rank order: the global micro-batch order
        at = 0
        for m in self.mods:
            running_mean, running_var, tracked = _stats(m)
            c = running_mean.numel()
            mean, var = rows[:, at : at + c], rows[:, at + c : at + 2 * c]
            at += 2 * c
            r_mean, r_var = running_mean.to(torch.float64), running_var.to(torch.float64)
            n0 = int(tracked)
            for i in range(micro_batches):
                f = m.momentum if m.momentum is not None else 1.0 / (n0 + i + 1)
                r_mean = (1.0 - f) * r_mean + f * mean[i]
                r_var = (1.0 - f) * r_var + f * var[i]
            running_mean.copy_(r_mean)
            running_var.copy_(r_var)
            tracked.fill_(n0 + micro_batches)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
