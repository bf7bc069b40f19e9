"""Gradient sums that give the same bits at any world size: ``DistributedOptimizer(
deterministic=True)`` (this module), and BatchNorm statistics folded in the global micro-batch
order (:class:`BatchNormFold`).

A float sum rounds differently in different orders, and the order of a data-parallel sum
depends on the world size (which rank holds which micro-batch, how a rank's backward passes
accumulate, how the ranks' partial sums meet). Here every micro-batch's gradient is rounded
once onto a fixed-point grid and added as int64, whose addition is exact and associative:
any grouping, over any number of ranks, gives the same integers.

The grid of a parameter, for one step: values ``|g| < 2**T`` are kept as ``round(g / q)``
with the quantum ``q = 2**(T - P)``, ``P = 62 - bit_length(M - 1)`` for ``M`` micro-batches a
step, so that a sum of M of them stays below ``2**62``. ``T`` comes from the previous step's
largest ``|g|`` over all micro-batches and ranks (a MAX allreduce: exact, order-free), with
``HEADROOM_BITS`` (16) bits to spare for growth; the first step uses ``2**FIRST_TOP_LOG2``
(``2**16``). None of it depends on the world size.

The error of the reduced gradient against the exact real sum, per element: at most
``M * q / 2`` for the sum (``q / 2`` for the average), plus the final rounding (int64 ->
float64, times q, divided by M in float64: within ``2**-52`` relative; then once to the
parameter's dtype: half an ulp there).

A finite gradient at or above ``2**T`` would overflow the grid: every rank raises
:class:`GridOverflowError` at ``step()``, naming the parameter, its largest ``|g|`` and the
bound; the grid of the next step covers that value (the step's gradients are dropped; run it
again). A non-finite gradient (inf, NaN) makes that parameter's reduced gradient all NaN on
every rank, so that GradScaler skips the step as it would.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import cast

import torch

from .._core import C
from ..collectives.inplace import Iallreduce, allreduce_
from ..collectives.rows import allgather
from ..runtime.agreement import mark_raised_on_every_rank

__all__ = ["GridOverflowError"]

#: The first step's grid covers |g| < 2**FIRST_TOP_LOG2.
FIRST_TOP_LOG2 = 16
#: Bits of growth of the largest |g| from one step to the next that the grid absorbs.
HEADROOM_BITS = 16


class GridOverflowError(ValueError):
    """A gradient outgrew the fixed-point grid of ``DistributedOptimizer(deterministic=True)``;
    raised on every rank at ``step()``. The next step's grid covers it: run the step again.

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> model = torch.nn.Linear(2, 1)
    >>> opt = fm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
    ...                               deterministic=True, check_every=0)
    >>> (model(torch.ones(1, 2)) * 1e9).sum().backward()  # beyond the first step's 2**16
    >>> try:
    ...     opt.step()
    ... except fm.GridOverflowError as e:
    ...     print("2**16" in str(e), isinstance(e, ValueError))
    True True
    >>> (model(torch.ones(1, 2)) * 1e9).sum().backward()  # the grid now covers it
    >>> opt.step()
    """


class ExactGradientSum:
    """The per-micro-batch quantization, the int64 accumulators and their allreduces for the
    parameters ``order`` (backward order). Collectives go to ``group`` (None: the world)."""

    def __init__(
        self,
        order: Sequence[torch.Tensor],
        names: Sequence[str],
        *,
        passes_per_step: int,
        world: int,
        average: bool,
        cap_bytes: int,
        group,
    ):
        for name, p in zip(names, order):
            if not p.is_floating_point():
                raise TypeError(
                    f"DistributedOptimizer(deterministic=True): parameter {name} is "
                    f"{p.dtype}; only real floating parameters are summed exactly"
                )
        self.order, self.names = list(order), list(names)
        self.k = passes_per_step
        self.micro_batches = passes_per_step * world
        self.bits = 62 - (self.micro_batches - 1).bit_length()  # P
        self.average, self.group = average, group
        self.top = [FIRST_TOP_LOG2] * len(self.order)  # T per parameter
        self.local_max = [-1.0] * len(self.order)  # this step's largest |g|; -1: none yet
        # One flat int64 accumulator per bucket, views per parameter, in backward order.
        self.buckets: list[list[int]] = []
        size = 0
        for i, p in enumerate(self.order):
            if not self.buckets or size + 8 * p.numel() > cap_bytes:
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(i)
            size += 8 * p.numel()
        self.flats = []
        self.acc: list[torch.Tensor] = [torch.empty(0)] * len(self.order)
        self.bucket_of = [0] * len(self.order)
        for b, members in enumerate(self.buckets):
            flat = torch.zeros(sum(self.order[i].numel() for i in members), dtype=torch.int64)
            self.flats.append(flat)
            at = 0
            for i in members:
                n = self.order[i].numel()
                self.acc[i] = flat[at : at + n].view(self.order[i].shape)
                self.bucket_of[i] = b
                at += n
        self._reset_step()

    def _reset_step(self) -> None:
        self.passes = 0  # backward passes quantized this step
        self.missing = [len(m) for m in self.buckets]  # members not yet ready in the last pass
        self.requests: list = []  # started bucket allreduces, in bucket order
        self.written = [False] * len(self.order)  # acc holds this step's values (else stale)
        # each parameter's gradient of the last pass, when the result can be written into it
        self.spare: list[torch.Tensor | None] = [None] * len(self.order)
        self.local_max = [-1.0] * len(self.order)

    def quantum(self, i: int) -> float:
        """The grid step of parameter ``i`` this step."""
        return math.ldexp(1.0, self.top[i] - self.bits)

    def grid(self) -> dict[str, tuple[int, float]]:
        """name -> (T: this step's grid covers |g| < 2**T, the quantum q)."""
        return {n: (self.top[i], self.quantum(i)) for i, n in enumerate(self.names)}

    # ---- during backward ------------------------------------------------------------
    def add(self, i: int, last_pass: bool) -> None:
        """Quantize parameter ``i``'s gradient of this backward pass into its accumulator and
        take it off the parameter (kept, when it can be, as the memory of the step's result);
        in the step's last pass, start the buckets that are complete."""
        p = self.order[i]
        g = p.grad
        if g is not None:
            keep = (
                not g.requires_grad  # (before detach, which clears it)
                and g.dtype == p.dtype
                and g.shape == p.shape
                and g.device.type == "cpu"
                and g.is_contiguous()
            )
            g = g.detach()
            mx = self._quantize_into(i, g)
            self.spare[i] = g if keep else None
            if not mx <= self.local_max[i]:  # also NaN
                self.local_max[i] = mx
            p.grad = None
        if last_pass:
            b = self.bucket_of[i]
            self.missing[b] -= 1
            self._start_ready()

    def end_pass(self, last_pass: bool) -> None:
        """The end of a backward pass; in the last one, start every bucket not started (their
        parameters had no gradient on this rank)."""
        self.passes += 1
        if last_pass:
            while len(self.requests) < len(self.buckets):
                self._start(len(self.requests))

    def _start_ready(self) -> None:
        # Buckets start in order on every rank (the collectives' order must be the same).
        while len(self.requests) < len(self.buckets) and self.missing[len(self.requests)] <= 0:
            self._start(len(self.requests))

    def _quantize_into(self, i: int, g: torch.Tensor) -> float:
        """acc[i] (+)= round(g * 2**(P - T)) in one pass of the compiled kernel, which
        returns the largest |g| (NaN for a NaN). The product is exact in float64 (a power of
        two) and the rounding is to nearest, ties to even. Elements at or beyond 2**T (or not
        finite) add 0: the step then raises or writes NaN, and never reads these sums."""
        mx = C.exact_quantize(
            g.cpu(),
            self.acc[i],
            math.ldexp(1.0, self.bits - self.top[i]),
            math.ldexp(1.0, self.top[i]),
            self.written[i],
        )
        self.written[i] = True
        return mx

    def _start(self, b: int) -> None:
        for i in self.buckets[b]:  # no gradient this step on this rank: adds nothing
            if not self.written[i]:
                self.acc[i].zero_()
        self.requests.append(Iallreduce(self.flats[b], "sum", group=self.group))

    # ---- at step() -------------------------------------------------------------------
    def finish(self, extra: Sequence[float] = ()) -> list[float]:
        """Wait for the sums, agree on the maxima (one MAX allreduce, which also carries
        ``extra``: returned, maxed over the ranks), check and write every ``p.grad``."""
        while len(self.requests) < len(self.buckets):  # no last pass ran on this rank
            self._start(len(self.requests))
        for r in self.requests:
            r.wait()
        agreed = torch.tensor(
            [*self.local_max, self.passes, -self.passes, *extra], dtype=torch.float64
        )
        allreduce_(agreed, "max", group=self.group)
        n = len(self.order)
        most, fewest = int(agreed[n]), -int(agreed[n + 1])
        if most != self.k or fewest != self.k:
            self._reset_step()
            raise mark_raised_on_every_rank(
                ValueError(
                    f"DistributedOptimizer(deterministic=True): every rank must run "
                    f"backward_passes_per_step={self.k} backward passes (one per micro-batch) "
                    f"before step(); the ranks ran {fewest} to {most}"
                )
            )
        over = []
        for i, p in enumerate(self.order):
            gm = float(agreed[i])
            if gm < 0:  # no gradient on any rank
                p.grad = None
            elif not math.isfinite(gm):
                p.grad = torch.full_like(p, math.nan)
            elif gm >= math.ldexp(1.0, self.top[i]):
                over.append((self.names[i], gm, self.top[i]))
            else:
                # acc * q (/ M) in float64, rounded once to p's dtype: q is a power of two, so
                # dividing by M / q (exact) rounds as times q, then / M would
                q = self.quantum(i)
                # into the last pass's gradient (a fresh tensor costs its page faults)
                g = self.spare[i]
                if g is None:
                    g = torch.empty(p.shape, dtype=p.dtype)
                C.exact_dequantize(
                    self.acc[i], g, self.micro_batches / q if self.average else 1 / q
                )
                p.grad = g.to(p.device)
            if gm > 0 and math.isfinite(gm):
                self.top[i] = math.frexp(gm)[1] + HEADROOM_BITS  # gm < 2**frexp exponent
        self._reset_step()
        if over:
            name, gm, top = over[0]
            raise mark_raised_on_every_rank(
                GridOverflowError(
                    f"DistributedOptimizer(deterministic=True): a gradient of {name} reached "
                    f"|g| = {gm:.6g}, beyond its fixed-point grid (|g| < 2**{top}, from the "
                    f"previous step's largest |g| and {HEADROOM_BITS} bits of headroom)"
                    + (f"; {len(over) - 1} more parameters too" if len(over) > 1 else "")
                    + ". The step's gradients are dropped; the next step's grid covers them: "
                    "run the step again"
                )
            )
        return agreed[n + 2 :].tolist()


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
    contiguous micro-batches), and every rank folds them into the running statistics in that
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
