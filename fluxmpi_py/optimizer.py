"""DistributedOptimizer and allreduce_gradients: data-parallel gradient averaging.

N ranks with local batch B train like one process with batch N*B: during backward, each
parameter's post-accumulate hook hands its gradient to the C++ reducer, which reduces
buckets of gradients on the engine thread while backward goes on; ``step()`` waits for the
rest and then runs the wrapped optimizer.
"""
from __future__ import annotations

import contextlib
import operator
from typing import Callable, Iterable, List, Optional, Sequence, Tuple, Union

import torch

from ._agreement import first_difference, hash64, mark_raised_on_every_rank, user_call
from ._loader import C
from .collectives import allreduce_

__all__ = ["DistributedOptimizer", "allreduce_gradients"]

_MiB = 1 << 20
_NEVER = 1 << 62  # direct_min_bytes=None: every gradient lives in a persistent fused buffer
#: Gradients of at least this many bytes are reduced in their own storage, without a copy.
DEFAULT_DIRECT_MIN_BYTES = 1 << 20


def _describe(name: str, p: torch.Tensor) -> str:
    return f"{name}: shape {tuple(p.shape)}, dtype {str(p.dtype).replace('torch.', '')}, device {p.device.type}"


def _check_same_parameters(names: Sequence[str], params: Sequence[torch.Tensor], what: str) -> int:
    """Collective: verify every rank holds the same parameter list; return its hash.

    On a difference every rank raises ValueError naming the first parameter (in the order
    the optimizer lists them) that differs, the rank that has it and rank 0's version of it.
    """
    descs = [_describe(n, p) for n, p in zip(names, params)]
    diff = first_difference(descs, "parameters")
    if diff is not None:
        index, rank, theirs, ref0 = diff
        raise mark_raised_on_every_rank(ValueError(
            f"{what}: the parameters differ across ranks; first difference at parameter {index}: "
            f"rank {rank} has {theirs}, rank 0 has {ref0}. Every rank must build the same model "
            f"and optimizer (same parameters, order, shapes, dtypes and requires_grad)."
        ))
    return hash64("\n".join(descs))


def _plan_order(params: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    # Backward produces gradients roughly in reverse registration order: plan buckets so.
    return list(params)[::-1]


class DistributedOptimizer(torch.optim.Optimizer):
    """Wrap a torch optimizer so that ``step()`` applies the gradient averaged over all ranks.

    Buckets of gradients (at most ``bucket_cap_mb`` MiB each, per dtype and device) are reduced
    on the engine thread while backward is still running; ``step()`` waits for the rest, then
    steps the wrapped optimizer. No gradient is packed or unpacked. A gradient of at least
    ``direct_min_bytes`` (1 MiB) is reduced in its own storage, the tensor autograd made: no
    copy and no second buffer ("average" divides inside the reduction). Smaller gradients live
    as views of their bucket's persistent flat buffer (like DDP's gradient_as_bucket_view), so
    one call reduces many of them; a fresh one is copied in once. ``direct_min_bytes=None`` puts
    every gradient in flat buffers.

    ``op="average"`` (default) averages like DDP and Horovod; ``op="sum"`` is FluxMPI's
    semantics (then scale the loss by ``1 / total_workers()`` yourself). ``compression`` is
    None, "fp16" or "bf16": buckets travel in 16 bits and come back into the full-precision
    gradients. ``backward_passes_per_step=k`` accumulates k backward passes locally before one
    reduction (or use the ``no_sync()`` context). Constructing it is a collective: the ranks
    check once that they hold the same parameters.

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> model = torch.nn.Linear(4, 2)
    >>> opt = fm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    >>> model(torch.randn(8, 4)).pow(2).mean().backward()
    >>> opt.step(); opt.zero_grad()
    """

    @user_call.of("DistributedOptimizer()")
    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        op: str = "average",
        bucket_cap_mb: float = 25,
        compression: Optional[str] = None,
        backward_passes_per_step: int = 1,
        direct_min_bytes: Optional[int] = DEFAULT_DIRECT_MIN_BYTES,
        named_parameters: Optional[Iterable[Tuple[str, torch.Tensor]]] = None,
    ):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"DistributedOptimizer wraps a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if isinstance(optimizer, DistributedOptimizer):
            raise TypeError("the optimizer is already a DistributedOptimizer")
        if op not in ("sum", "average", "avg", "mean"):
            raise ValueError(f"DistributedOptimizer(op={op!r}): expected 'average' or 'sum'")
        if compression not in (None, "none", "fp16", "bf16", "float16", "bfloat16"):
            raise ValueError(f"DistributedOptimizer(compression={compression!r}): expected None, 'fp16' or 'bf16'")
        if not (isinstance(backward_passes_per_step, int) and backward_passes_per_step >= 1):
            raise ValueError(f"backward_passes_per_step must be an int >= 1, got {backward_passes_per_step!r}")
        if not bucket_cap_mb > 0:
            raise ValueError(f"bucket_cap_mb must be > 0, got {bucket_cap_mb!r}")
        if not C.initialized():
            raise RuntimeError("fluxmpi_py is not initialized: call fluxmpi_py.Init() first")
        # Share the wrapped optimizer's groups and state: LR schedulers and checkpoints that
        # touch this object touch the real optimizer.
        super().__init__([{"params": [torch.zeros(0, requires_grad=True)]}], dict(optimizer.defaults))
        self.optimizer = optimizer
        self.param_groups = optimizer.param_groups
        self.state = optimizer.state
        self.defaults = optimizer.defaults
        self._op = "average" if op in ("avg", "mean") else op
        self._cap_bytes = int(bucket_cap_mb * _MiB)
        self._direct_min_bytes = _NEVER if direct_min_bytes is None else int(direct_min_bytes)
        self._compression = "" if compression in (None, "none") else compression
        self._passes_per_step = backward_passes_per_step
        self._names = {id(p): n for n, p in named_parameters} if named_parameters is not None else {}
        self._passes = 0               # backward passes since the last step
        self._pass_hooked = False      # end-of-backward callback queued for this pass
        self._sync_enabled = True      # False inside no_sync()
        self._skip_sync = False        # True inside skip_synchronize()
        self._synchronized = False     # synchronize() already ran for this step
        self._handles = []
        self._build()

    # ---- plan and hooks -------------------------------------------------------------
    def _build(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        params, names = [], []
        for g, group in enumerate(self.param_groups):
            for i, p in enumerate(group["params"]):
                if p.requires_grad:
                    params.append(p)
                    names.append(self._names.get(id(p), f"param_groups[{g}][{i}]"))
        plan_hash = _check_same_parameters(names, params, "DistributedOptimizer()")
        plan_hash = hash64("\n".join([str(plan_hash), self._op, self._compression, str(self._cap_bytes),
                                       str(self._direct_min_bytes)]))
        params = _plan_order(params)
        self._params = params
        self._reducer = C.GradientReducer(params, self._cap_bytes, self._direct_min_bytes, self._op, self._compression, plan_hash)
        for i, p in enumerate(params):
            self._handles.append(p.register_post_accumulate_grad_hook(self._make_hook(i)))

    def _make_hook(self, index: int) -> Callable:
        reducer_ref = self  # the hook must see a rebuilt reducer after add_param_group

        def hook(param: torch.Tensor) -> None:
            if not reducer_ref._pass_hooked:
                reducer_ref._pass_hooked = True
                torch.autograd.Variable._execution_engine.queue_callback(reducer_ref._end_of_backward)
            if reducer_ref._sync_enabled and reducer_ref._passes + 1 >= reducer_ref._passes_per_step:
                reducer_ref._reducer.mark_ready(index)

        return hook

    def _end_of_backward(self) -> None:
        self._pass_hooked = False
        if self._sync_enabled:
            self._passes += 1

    # ---- reduction control --------------------------------------------------------------
    @user_call.of("DistributedOptimizer.synchronize()")
    def synchronize(self) -> None:
        """Finish the gradient reduction now (for clipping or GradScaler.unscale_ before step).

        Then call ``step()`` inside ``skip_synchronize()``.
        """
        self._reducer.finalize()
        self._synchronized = True
        self._passes = 0

    @contextlib.contextmanager
    def skip_synchronize(self):
        """``step()`` inside this context does not reduce again (after ``synchronize()``)."""
        prev, self._skip_sync = self._skip_sync, True
        try:
            yield
        finally:
            self._skip_sync = prev

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate gradients locally, without communication."""
        prev, self._sync_enabled = self._sync_enabled, False
        try:
            yield
        finally:
            self._sync_enabled = prev

    # ---- torch.optim.Optimizer API ---------------------------------------------------------
    @user_call.of("DistributedOptimizer.step()")
    def step(self, closure: Optional[Callable] = None):
        """Wait for the gradient reduction, then step the wrapped optimizer.

        With a closure (e.g. LBFGS, which re-evaluates it), every evaluation's gradients are
        reduced and its loss averaged over the ranks, so all ranks take the same decisions.
        """
        if closure is not None:
            def reduced_closure():
                with torch.enable_grad():
                    loss = closure()
                self._reducer.finalize()
                if isinstance(loss, torch.Tensor):
                    loss = allreduce_(loss.detach().clone(), "average")
                return loss

            self._synchronized = False
            self._passes = 0
            return self.optimizer.step(reduced_closure)
        if not self._skip_sync and not self._synchronized:
            self._reducer.finalize()
        self._synchronized = False
        self._passes = 0
        return self.optimizer.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    @user_call.of("DistributedOptimizer.add_param_group()")
    def add_param_group(self, param_group: dict) -> None:
        """Add a group to the wrapped optimizer; a collective (the plan is rebuilt and checked)."""
        if not hasattr(self, "optimizer"):  # called by Optimizer.__init__ for the placeholder
            return super().add_param_group(param_group)
        self.optimizer.add_param_group(param_group)
        self._build()

    def state_dict(self):
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict) -> None:
        self.optimizer.load_state_dict(state_dict)
        self.state = self.optimizer.state
        self.param_groups = self.optimizer.param_groups

    def __getstate__(self):
        raise TypeError("DistributedOptimizer cannot be pickled; save its state_dict() instead")

    def __repr__(self) -> str:
        return f"DistributedOptimizer(op={self._op!r}, buckets={len(self._reducer.plan())}, {self.optimizer!r})"

    @property
    def buckets(self) -> list:
        """The bucket plan, in issue order (for inspection): dicts with members, direct, numel."""
        return self._reducer.plan()


_reducer_cache: dict = {}


@user_call.of("allreduce_gradients()")
def allreduce_gradients(model_or_params: Union[torch.nn.Module, Iterable[torch.Tensor]], op: str = "average",
                        *, bucket_cap_mb: float = 25,
                        direct_min_bytes: Optional[int] = DEFAULT_DIRECT_MIN_BYTES) -> None:
    """Reduce the ``.grad`` of every parameter over all ranks in one fused call (FluxMPI's
    ``allreduce_gradients``), for training loops without DistributedOptimizer.

    A gradient missing on some ranks counts as zeros there; missing on every rank stays None.
    Small gradients may afterwards be views of a fused buffer (as DDP's gradient_as_bucket_view).

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> m = torch.nn.Linear(3, 1); m(torch.ones(2, 3)).sum().backward()
    >>> fm.allreduce_gradients(m)
    """
    if op not in ("sum", "average", "avg", "mean"):
        raise ValueError(f"allreduce_gradients(op={op!r}): expected 'average' or 'sum'")
    direct = _NEVER if direct_min_bytes is None else int(direct_min_bytes)
    is_module = isinstance(model_or_params, torch.nn.Module)
    given = list(model_or_params.parameters()) if is_module else list(model_or_params)
    # The same parameters as last time (checked by identity, at C speed): reuse the reducer,
    # its plan and its buffers; per call that leaves only the reduction itself.
    key = (id(model_or_params), len(given), op, bucket_cap_mb, direct)
    hit = _reducer_cache.get(key)
    if hit is None or not all(map(operator.is_, hit[0], given)):
        if is_module:
            named = [(n, p) for n, p in model_or_params.named_parameters() if p.requires_grad]
        else:
            if not all(isinstance(p, torch.Tensor) for p in given):
                raise TypeError("allreduce_gradients takes an nn.Module or an iterable of tensors")
            named = [(f"params[{i}]", p) for i, p in enumerate(given) if p.requires_grad]
        h = _check_same_parameters([n for n, _ in named], [p for _, p in named], "allreduce_gradients()")
        params = _plan_order([p for _, p in named])
        if len(_reducer_cache) > 8:
            _reducer_cache.clear()
        hit = (given, C.GradientReducer(params, int(bucket_cap_mb * _MiB), direct, op, "", h))
        _reducer_cache[key] = hit
    hit[1].finalize()
