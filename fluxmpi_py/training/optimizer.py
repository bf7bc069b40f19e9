"""DistributedOptimizer: data-parallel gradient averaging (allreduce_gradients, for loops
without it, is in :mod:`fluxmpi_py.gradients`).

N ranks with local batch B train like one process with batch N*B: during backward, each
parameter's post-accumulate hook hands its gradient to the C++ reducer, which reduces
buckets of gradients on the engine thread while backward goes on; ``step()`` waits for the
rest and then runs the wrapped optimizer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any, Callable

import torch

from .._core import C
from ..runtime.agreement import raise_together, user_call
from ..runtime.entry import entry_point, local_call, own_agreement
from ..runtime.groups import on_group
from ._atomic_steps import AtomicSteps
from ._deterministic import deterministic_buffers, finish_exact_step
from ._exact_shards import exact_sum_for
from ._failed_step import FailedSteps
from ._grad_hooks import GradHooks
from ._micro_batches import micro_batch_share
from ._optimizer_args import check_optimizer_args, reduction_options
from ._reduction_plan import ReductionPlan, named_candidates, replan_if_changed
from ._step_checks import StepChecks
from ._wrapped import WrappedOptimizer
from .buffers import BufferSync, watch_unsynced_buffers
from .join import Joinable, grad_scale, round_

__all__ = ["DistributedOptimizer"]

#: Gradients of at least this many bytes are reduced in their own storage, without a copy.
DEFAULT_DIRECT_MIN_BYTES = 1 << 20


class DistributedOptimizer(GradHooks, FailedSteps, AtomicSteps, WrappedOptimizer, Joinable):
    """Wrap a torch optimizer so that ``step()`` applies the gradient averaged over all ranks.

    ``DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), module=model)``: the
    gradients are reduced in buckets while backward runs, and ``step()`` waits for the last
    bucket, then steps the wrapped optimizer. It is that optimizer: it shares its
    ``param_groups`` and ``state``, so LR schedulers and checkpoints work unchanged.
    Constructing it is a collective: the ranks check once that they hold the same parameters.
    How the buckets and the direct gradients work: the guide's
    [How the reduction runs][how-the-reduction-runs]; the exact sums of ``deterministic``:
    [The same bits at any world size][the-same-bits-at-any-world-size].

    Args:
        optimizer: the torch optimizer to wrap, built on this rank's model parameters.
        op: ``"average"`` (also ``"mean"``, ``"avg"``) as DDP and Horovod, or ``"sum"``
            (FluxMPI's; scale the loss by ``1 / total_workers()`` yourself).
        bucket_cap_mb: the largest bucket of gradients reduced in one call, in MiB (per dtype
            and device).
        compression: None, ``"fp16"`` or ``"bf16"``: buckets travel in 16 bits and come back
            into the full-precision gradients.
        backward_passes_per_step: backward passes (micro-batches) accumulated locally before
            one reduction (or use ``no_sync()``); it may differ by rank (the global-batch
            sampler's ``micro_batches_per_rank``): every micro-batch then weighs alike.
        direct_min_bytes: host gradients of at least this many bytes are reduced in their own
            storage, without a copy; None: every gradient lives in a flat bucket buffer.
        cuda_direct_min_bytes: the same for CUDA gradients; None: all in flat buffers, as DDP.
        first_bucket_cap_mb: a smaller first bucket per dtype and device (DDP's is 1 MiB), so
            that its reduction starts early; None: ``bucket_cap_mb``.
        named_parameters: ``model.named_parameters()``, so that errors name parameters.
        module: the model; its buffers (BatchNorm's running statistics) are then kept equal
            on every rank after each step, as ``buffers`` says.
        buffers: with ``module``: ``"average"`` averages floating buffers and takes integer
            ones from rank 0; ``"broadcast"`` takes all from rank 0 (as DDP); None: neither.
        check_every: run `check_consistency` on the parameters and the optimizer's state after
            every N-th ``step()``; None: the first step checks the parameters alone; 0: never.
        group: a [`Group`][fluxmpi_py.Group]: average over its members only (ranks outside it
            may not construct it); None: every rank.
        deterministic: True: the same bits at any world size (exact int64 sums of each
            micro-batch's gradient; not with ``compression``, a closure or ``Join``).

    Raises:
        TypeError: on every rank, for an argument of the wrong type on any rank (a model
            where the optimizer belongs, say).
        ValueError: on every rank, for a bad value, or ranks whose parameters differ (naming
            the first).
        GridOverflowError: at ``step()`` with ``deterministic=True``, for a gradient beyond
            the agreed grid.
        RuntimeError: at ``step()`` on every rank, naming the rank, for a gradient it could
            not reduce, its backward pass that raised, or its wrapped step that raised before.

    Examples:
        >>> import torch, fluxmpi_py as fm; fm.Init()
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.BatchNorm1d(2))
        >>> model = fm.synchronize_(model)  # the same start on every rank
        >>> opt = fm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), module=model)
        >>> model(torch.randn(8, 4)).pow(2).mean().backward()
        >>> opt.step(); opt.zero_grad()
    """

    @entry_point("DistributedOptimizer()")
    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        op: str = "average",
        bucket_cap_mb: float = 25,
        compression: str | None = None,
        backward_passes_per_step: int = 1,
        direct_min_bytes: int | None = DEFAULT_DIRECT_MIN_BYTES,
        cuda_direct_min_bytes: int | None = None,
        first_bucket_cap_mb: float | None = None,
        named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
        module: torch.nn.Module | None = None,
        buffers: str | None = "average",
        check_every: int | None = None,
        group=None,
        deterministic: bool = False,
    ):
        error = None
        try:
            if isinstance(optimizer, DistributedOptimizer):
                raise TypeError("the optimizer is already a DistributedOptimizer")
            check_optimizer_args(
                optimizer, op, backward_passes_per_step, check_every, buffers, module
            )
            # The reduction's options, built once from the arguments (and checked there),
            # before the first collective: both paths plan their buckets with them.
            options = reduction_options(
                "DistributedOptimizer",
                op=op,
                compression=compression,
                bucket_cap_mb=bucket_cap_mb,
                first_bucket_cap_mb=first_bucket_cap_mb,
                direct_min_bytes=direct_min_bytes,
                cuda_direct_min_bytes=cuda_direct_min_bytes,
            )
            if not isinstance(deterministic, bool):
                raise TypeError(
                    f"DistributedOptimizer(deterministic=...) takes a bool, got {deterministic!r}"
                )
            if deterministic and options.compression is not None:
                raise ValueError(
                    f"DistributedOptimizer(deterministic=True) sums exactly in int64: "
                    f"compression={compression!r} is not supported with it"
                )
            names = {id(p): n for n, p in named_parameters} if named_parameters is not None else {}
        except Exception as e:  # noqa: BLE001 - raised below, on every rank of the group
            error = e
        if not C.initialized():
            if error is not None:
                raise error
            raise RuntimeError("fluxmpi_py is not initialized: call fluxmpi_py.Init() first")
        on_group(group, "DistributedOptimizer()")  # a rank outside the group raises here
        self._group = group
        with on_group(group, "DistributedOptimizer()"):
            # A bad argument on one rank raises on every rank, before the plan's collectives.
            raise_together(error, "DistributedOptimizer()")
            # Share the wrapped optimizer's groups and state: LR schedulers and checkpoints that
            # touch this object touch the real optimizer.
            self._wrap(optimizer)
            self._op = options.op  # "average" for "avg" and "mean" too
            self._passes_per_step = backward_passes_per_step
            self._names = names
            self._passes = 0  # backward passes since the last step
            self._pass_end = None  # the open backward pass's end (._abandoned_pass)
            self._sync_enabled = True  # False inside no_sync()
            self._skip_sync = False  # True inside skip_synchronize()
            self._synchronized = False  # synchronize() already ran for this step
            self._handles: list[torch.utils.hooks.RemovableHandle] = []
            self._checks = StepChecks(
                check_every,
                module,
                self._names,
                unequal_start=self._unequal_start,
                remedy=self._start_remedy,
            )
            self._join = None  # (JoinState, index) inside fluxmpi_py.Join (see join.py)
            self._join_count = 0  # active ranks in this step's join round; 0: no round yet
            self._options = options  # the reduction's options (op, caps, compression)
            self._deterministic, self._module, self._buffers = deterministic, module, buffers
            self._applied_steps = 0  # steps applied; in the shrink mode, agreed by every rank
            self._bn_fold: Any = None  # deterministic=True with module=: BatchNorm statistics
            self._build()

    # ---- plan and hooks -------------------------------------------------------------
    def _build(self) -> None:
        """The reduction plan, the exact sums, the hooks and the buffer sync, for the world
        (or group) as it is now: a collective of its ranks."""
        if self._bn_fold is not None:  # a rebuild: the old one's hooks go
            self._bn_fold.remove()
        # deterministic=True: the exact sums reduce; the plan gives the order and watches
        # requires_grad, with no bucket of its own
        self._plan = ReductionPlan(
            self._named(),
            "DistributedOptimizer()",
            self._options,
            reduces=not self._deterministic,
        )
        self._num_groups = len(self.param_groups)
        # every rank's passes (M) and this rank's weight in the default path (._micro_batches)
        self._micro_batches, self._pass_weight, even = self._passes_per_step, 1.0, True
        if self._weigh_uneven_passes or self._deterministic:
            self._micro_batches, self._pass_weight, even = micro_batch_share(
                self._passes_per_step, self._group
            )
        self._exact = None  # deterministic=True: the exact int64 sums
        self._bn_fold = None  # deterministic=True with module=: BatchNorm statistics
        if self._deterministic:
            planned = [(n, p) for n, p in self._named() if p.requires_grad][::-1]
            self._exact = exact_sum_for(
                [p for _, p in planned],
                [n for n, _ in planned],
                self._options,
                passes_per_step=self._passes_per_step,
                micro_batches=self._micro_batches,
                even=even,
                group=self._group,
            )
        self._hook(self._plan.order)
        self._buffer_sync = None  # keeps module's buffers equal across ranks
        self._buffer_watch = None  # warns once when unsynced buffers change
        module, buffers = self._module, self._buffers
        if self._deterministic and module is not None and buffers is not None:
            self._bn_fold, self._buffer_sync = deterministic_buffers(module, self._group)
        elif module is not None and buffers is not None:
            self._buffer_sync = BufferSync(module, buffers, "DistributedOptimizer(module=...)")
        elif module is None:
            self._buffer_watch = watch_unsynced_buffers(self.param_groups)

    def _named(self):
        return named_candidates(self.param_groups, self._names)

    def _join_round(self) -> None:
        """Inside a join: this step's round, as an active rank (a tiny collective)."""
        assert self._join is not None  # called inside a Join only
        state, index = self._join
        with on_group(self._group, "DistributedOptimizer.step()"):  # backward's hook: no group
            self._join_count = round_(state, index)

    def _reduce(self, error: Exception | None = None) -> None:
        """Finish this step's reduction; re-plan on every rank if any rank's parameters
        changed (requires_grad flipped, or a group was added). Inside a join, the step's
        round goes first, and the average is rescaled when it divides by the active ranks.
        ``error``: this rank's error in the call, which the reduction raises on every rank
        (else a pass of this step that raised, ._abandoned_pass). It ends the step's passes,
        also where it raises."""
        error, self._broken, self._passes = error or self._broken, None, 0
        if self._exact is not None:
            self._exact_reduce(error)
            return
        if self._join is not None:
            if not self._join_count:
                self._join_round()
            count, self._join_count = self._join_count, 0
            self._finish_reduction(error)
            self._rescale_for_join(count)
            return
        self._finish_reduction(error)

    def _exact_reduce(self, error: Exception | None = None) -> None:
        """deterministic=True: finish the exact sums, then fold the BatchNorm statistics."""
        assert self._exact is not None
        if error is not None and self._exact.noted is None:
            self._exact.noted = error  # raised by finish() on every rank
        if self._join is not None:
            raise ValueError("DistributedOptimizer(deterministic=True) cannot run inside a join")
        finish_exact_step(self._exact, self._bn_fold, self._plan.requires_grad_changed())

    def _rescale_for_join(self, count: int) -> None:
        assert self._join is not None  # called inside a Join only
        scale = grad_scale(self._join[0], count)
        if scale != 1.0 and self._op == "average":
            for p in self._plan.order:
                if p.grad is not None:
                    p.grad.mul_(scale)

    def _shadow_step(self, count: int) -> None:
        """A joined rank's part in an active rank's step: reduce zeros with the others and
        apply the reduced gradient, as they do."""
        self.optimizer.zero_grad(set_to_none=True)
        with on_group(self._group, "hvd.join()"):
            self._finish_reduction()
            self._rescale_for_join(count)
            self._synchronized = False
            self._passes = 0
            self._apply(None)

    def _finish_reduction(self, error: Exception | None = None) -> None:
        changed = len(self.param_groups) != self._num_groups or self._plan.requires_grad_changed()
        order = replan_if_changed(self._plan, changed, self._named, error)
        if order is not None:
            self._num_groups = len(self.param_groups)
            self._hook(order)

    # ---- reduction control --------------------------------------------------------------
    @own_agreement
    @user_call.of("DistributedOptimizer.synchronize()")
    def synchronize(self) -> None:
        """Finish the gradient reduction now (for clipping or GradScaler.unscale_ before step).

        Then call ``step()`` inside ``skip_synchronize()``.
        """
        with on_group(self._group, "DistributedOptimizer.synchronize()"):
            self._raise_abandoned()
            self._reduce()
        self._synchronized = True
        self._passes = 0

    @local_call
    @contextlib.contextmanager
    def skip_synchronize(self):
        """``step()`` inside this context does not reduce again (after ``synchronize()``)."""
        prev, self._skip_sync = self._skip_sync, True
        try:
            yield
        finally:
            self._skip_sync = prev

    @local_call
    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate gradients locally, without communication."""
        prev, self._sync_enabled = self._sync_enabled, False
        try:
            yield
        finally:
            self._sync_enabled = prev

    # ---- torch.optim.Optimizer API ---------------------------------------------------------
    @own_agreement
    @user_call.of("DistributedOptimizer.step()")
    def step(self, closure: Callable | None = None):
        """Wait for the gradient reduction, then step the wrapped optimizer (and sync the
        module's buffers, overlapping the optimizer step, when built with ``module=``).

        With a closure (e.g. LBFGS, which re-evaluates it), every evaluation's gradients are
        reduced and its loss averaged over the ranks, so all ranks take the same decisions.

        Args:
            closure: as torch's ``step(closure)``: re-evaluates the loss; every evaluation's
                gradients are reduced and its loss averaged over the ranks.

        """
        with on_group(self._group, "DistributedOptimizer.step()"):
            return self._step(closure)

    def _closure_error(self, closure) -> Exception | None:
        if closure is not None and not callable(closure):
            return TypeError(
                f"DistributedOptimizer.step(closure={closure!r}): expected a callable or None, "
                f"got {type(closure).__name__}"
            )
        if closure is not None and self._exact is not None:
            return ValueError("DistributedOptimizer(deterministic=True).step() takes no closure")
        if closure is not None and self._join is not None:
            return ValueError(
                "DistributedOptimizer.step(closure) cannot run inside a join: a joined "
                "rank cannot re-evaluate the closure with the others"
            )
        return None

    def _step(self, closure):
        self._raise_abandoned()
        error = self._closure_error(closure)
        if error is not None:  # where the others reduce: the reduction raises it on every rank
            if not self._skip_sync and not self._synchronized:
                self._reduce(error)
            raise error  # (a world of one, or no reduction in this step: no rank waits)
        if closure is not None:
            self._synchronized = False
            self._passes = 0
            return self._apply(self._reduced(closure))
        if not self._skip_sync and not self._synchronized:
            self._reduce()
        self._synchronized = False
        self._passes = 0
        result = self._apply(None)
        if self._exact is not None:  # a stale gradient would join the next step's first pass
            for p in self._exact.order:
                p.grad = None
        return result

    #: What the first step's check does when the ranks' parameters differ ("raise", or
    #: "warn" for hvd.DistributedOptimizer: Horovod lets such a step run), and the remedy the
    #: message names.
    _unequal_start = "raise"
    _start_remedy = "fm.synchronize_(model) after building or loading it"
    #: Ranks with different backward_passes_per_step weigh by their share of the step's
    #: micro-batches (:mod:`._micro_batches`); False: alike, as Horovod's average.
    _weigh_uneven_passes = True

    def _step_and_sync_buffers(self, closure):
        if self._buffer_watch is not None:
            watch, self._buffer_watch = self._buffer_watch, None
            watch.check()
        if C.shrink_mode():
            return self._apply_agreed(closure)
        if self._buffer_sync is None or closure is not None:
            result = self.optimizer.step() if closure is None else self.optimizer.step(closure)
            if self._buffer_sync is not None:
                self._buffer_sync()  # the closure ran forward passes: sync after the last
            return result
        # The buffers travel while the optimizer steps (it touches parameters only).
        pending = self._buffer_sync.start()
        try:
            return self.optimizer.step()
        finally:
            self._buffer_sync.finish(pending)

    @local_call
    @user_call.of("DistributedOptimizer.add_param_group()")
    def add_param_group(self, param_group: dict) -> None:
        """Add a group to the wrapped optimizer. Its parameters join the reduction at the next
        ``step()`` (or ``synchronize()``), which re-plans on every rank together and also
        reduces their gradients from the backward before it.

        Args:
            param_group: as torch's: a dict with ``"params"`` and the group's settings.

        """
        return super().add_param_group(param_group)

    def __repr__(self) -> str:
        return f"DistributedOptimizer(op={self._op!r}, buckets={len(self.buckets)}, {self.optimizer!r})"

    @local_call
    def exact_grid(self) -> dict[str, tuple[int, float]]:
        """deterministic=True: parameter name -> (T, q): the current step's grid keeps
        ``|g| < 2**T`` in multiples of the quantum ``q``."""
        if self._exact is None:
            raise ValueError("exact_grid() needs DistributedOptimizer(deterministic=True)")
        return self._exact.grid()

    @property
    def buckets(self) -> list:
        """The bucket plan, in issue order (for inspection): dicts with members, direct, numel.
        With ``deterministic=True``, the exact sums' buckets (the same planner, counting 8
        bytes a value where the sums travel as int64)."""
        return self._reducer.plan() if self._exact is None else self._exact.plan
