"""Horovod's training helpers on fluxmpi_py: ``DistributedOptimizer``, ``Compression``,
``broadcast_parameters`` and ``broadcast_optimizer_state``.

``DistributedOptimizer`` here is fluxmpi_py's own (fused buckets reduced while backward runs),
built from Horovod's arguments and checks; ``broadcast_optimizer_state`` is
:func:`fluxmpi_py.synchronize_` on the optimizer, which needs no dummy step.
"""

from __future__ import annotations

import warnings
from collections import Counter
from contextlib import contextmanager

import torch

from fluxmpi_py.runtime.entry import local_call, own_agreement

from ...collectives import rows as _gc
from ...sync.synchronize import synchronize_
from ...training.join import JoinState
from ...training.optimizer import DistributedOptimizer as _FluxDistributedOptimizer
from ._compression import Compression, Compressor, FP16Compressor, NoneCompressor, _wire
from ._ops import Average
from ._process_sets import group_of

__all__ = [
    "Compression",
    "Compressor",
    "NoneCompressor",
    "FP16Compressor",
    "DistributedOptimizer",
    "broadcast_parameters",
    "broadcast_optimizer_state",
]

_SUM, _AVERAGE, _ADASUM = "sum", "average", "adasum"


def _checked_names(optimizer, named_parameters):
    """Horovod's checks of ``named_parameters``: (name, tensor) pairs, unique names, every
    parameter of the optimizer named. Returns the list, or None."""
    if named_parameters is None:
        return None
    named = list(named_parameters)
    if not all(
        isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], torch.Tensor)
        for item in named
    ):
        raise ValueError(
            "named_parameters should be a sequence of (name, parameter) tuples, usually "
            "produced by model.named_parameters()"
        )
    dups = sorted(n for n, c in Counter(n for n, _ in named).items() if c > 1)
    if dups:
        raise ValueError(
            "Parameter names in named_parameters must be unique. Found duplicates: "
            + ", ".join(map(str, dups))
        )
    named_ids = {id(p) for _, p in named}
    unnamed = [
        f"param_groups[{g}][{i}] (shape {tuple(p.shape)})"
        for g, group in enumerate(optimizer.param_groups)
        for i, p in enumerate(group["params"])
        if id(p) not in named_ids
    ]
    if unnamed:
        raise ValueError(
            "named_parameters was specified, but one or more model parameters were not "
            "named: " + ", ".join(unnamed)
        )
    return named


def _check_groups(groups, num_groups):
    if num_groups:
        if groups is not None:
            raise ValueError("hvd.DistributedOptimizer: give groups= or num_groups=, not both")
        groups = num_groups
    if groups is None or (isinstance(groups, int) and not isinstance(groups, bool) and groups > 0):
        return
    if isinstance(groups, list) and all(
        isinstance(g, list) and all(isinstance(p, torch.Tensor) for p in g) for g in groups
    ):
        return
    raise ValueError(
        f"hvd.DistributedOptimizer(groups={groups!r}): expected a positive int or a list of "
        "lists of parameters"
    )


class _HorovodOptimizer(_FluxDistributedOptimizer):
    """fluxmpi_py's DistributedOptimizer with Horovod's warning for ``step()`` after
    ``synchronize()`` outside ``skip_synchronize()`` (the gradients are not reduced twice).
    Ranks whose parameters differ after the first step (no ``hvd.broadcast_parameters``) get a
    RuntimeWarning on every rank, not an error: Horovod runs such a step, and code that
    broadcasts the state right after one (its own suite's) must go on."""

    _parameter_names: dict  # parameter -> name, as Horovod's (set by DistributedOptimizer)
    _unequal_start = "warn"
    _start_remedy = "hvd.broadcast_parameters(model.state_dict(), root_rank=0) before training"
    _weigh_uneven_passes = False  # Horovod averages ranks alike, whatever their passes

    # Sparse gradients (nn.Embedding(sparse=True)): made dense when backward accumulates them,
    # reduced in the buckets with the rest, and made sparse again before the wrapped optimizer
    # steps (SparseAdam takes only sparse ones) or synchronize() returns: Horovod's
    # sparse_as_dense=True, which gives the same values as its allgather of the entries.
    def _make_hook(self, index):
        hook = super()._make_hook(index)
        sparse = self.__dict__.setdefault("_sparse_params", {})

        def densify_then(param):
            if param.grad is not None and param.grad.is_sparse:
                param.grad = param.grad.to_dense()
                sparse[id(param)] = param
            hook(param)

        return densify_then

    def _resparsify(self) -> None:
        for p in self.__dict__.get("_sparse_params", {}).values():
            if p.grad is not None and not p.grad.is_sparse:
                p.grad = p.grad.to_sparse()

    def _step_and_sync_buffers(self, closure):
        self._resparsify()
        return super()._step_and_sync_buffers(closure)

    @own_agreement
    def synchronize(self):
        super().synchronize()
        self._resparsify()

    @own_agreement
    def step(self, closure=None):
        if self._synchronized and not self._skip_sync:
            warnings.warn(
                "optimizer.step() called without optimizer.skip_synchronize() context after "
                "optimizer.synchronize(); the gradients already reduced are used (wrap step() "
                "in optimizer.skip_synchronize() to say so)",
                stacklevel=2,
            )
        return super().step(closure)


class _OutsideSetOptimizer(torch.optim.Optimizer):
    """``hvd.DistributedOptimizer(process_set=ps)`` on a rank outside ``ps``: as Horovod's, the
    wrapped optimizer alone (its groups and state read through), with ``synchronize()`` and
    ``skip_synchronize()`` doing nothing."""

    optimizer: torch.optim.Optimizer
    _parameter_names: dict  # parameter -> name, as Horovod's (set by DistributedOptimizer)

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        # No Optimizer.__init__: the groups, state and defaults are the wrapped one's.
        self.optimizer = optimizer
        self._optimizer_step_pre_hooks: dict = {}
        self._optimizer_step_post_hooks: dict = {}

    param_groups = property(lambda self: self.optimizer.param_groups)
    state = property(lambda self: self.optimizer.state)
    defaults = property(lambda self: self.optimizer.defaults)

    @local_call
    def step(self, closure=None):
        return self.optimizer.step() if closure is None else self.optimizer.step(closure)

    @local_call
    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    @local_call
    def synchronize(self) -> None:
        pass

    @local_call
    @contextmanager
    def skip_synchronize(self):
        yield

    @local_call
    def add_param_group(self, param_group: dict) -> None:
        self.optimizer.add_param_group(param_group)

    @local_call
    def state_dict(self):
        return self.optimizer.state_dict()

    @local_call
    def load_state_dict(self, state_dict) -> None:
        self.optimizer.load_state_dict(state_dict)

    def __repr__(self) -> str:
        return f"hvd.DistributedOptimizer(outside its process set, {self.optimizer!r})"


def DistributedOptimizer(
    optimizer,
    named_parameters=None,
    compression=Compression.none,
    backward_passes_per_step=1,
    op=Average,
    gradient_predivide_factor=1.0,
    num_groups=0,
    groups=None,
    sparse_as_dense=False,
    process_set=None,
):
    """Horovod's ``hvd.DistributedOptimizer``: ``step()`` applies the gradient reduced over
    every rank (``op=hvd.Average``, the default, or ``hvd.Sum``).

    Returns a :class:`fluxmpi_py.DistributedOptimizer` around ``optimizer`` (not a subclass
    of its class; the wrapped one is ``.optimizer``). ``backward_passes_per_step=k``
    accumulates k backward passes locally and reduces their sum once; ``synchronize()`` and
    ``skip_synchronize()`` work as in Horovod. Gradients are reduced in fused buckets while
    backward runs, so ``groups``/``num_groups`` (Horovod's fusion hint) are checked and
    otherwise not needed; ``gradient_predivide_factor`` gives the same average (it only moves
    where Horovod divides). Each step starts with one tiny allreduce so that ranks that ran
    out of data can ``hvd.join()``. ``compression=hvd.Compression.fp16`` sends the buckets as
    float16. ``named_parameters`` names the parameters in errors; Horovod's checks apply
    (ValueError for duplicate names or an unnamed parameter). Sparse gradients (e.g.
    ``nn.Embedding(sparse=True)``) are reduced dense and made sparse again before the step,
    whatever ``sparse_as_dense`` says (Horovod's ``sparse_as_dense=True``; the values are
    those of its allgather of the entries). ``process_set=`` averages over that set's ranks
    only (a member that has called ``hvd.join()`` shadows its steps); on a rank outside the
    set, as in Horovod, the result steps the wrapped optimizer alone (no communication).

    Args:
        optimizer: the torch optimizer to wrap.
        named_parameters: ``model.named_parameters()``, so that errors name parameters.
        compression: ``hvd.Compression.none``, or ``.fp16`` (buckets travel as float16).
        backward_passes_per_step: backward passes accumulated locally before one reduction.
        op: ``hvd.Average`` or ``hvd.Sum``.
        gradient_predivide_factor: where Horovod divides; the average is the same.
        num_groups: Horovod's fusion hint; checked, not needed (buckets fuse already).
        groups: Horovod's fusion groups; checked, not needed.
        sparse_as_dense: accepted; sparse gradients are reduced dense either way.
        process_set: average over this set's ranks only; a rank outside it steps alone.

    Returns:
        A ``fluxmpi_py.DistributedOptimizer`` around ``optimizer`` (``.optimizer`` is the wrapped one).

    >>> import torch, fluxmpi_py.horovod as hvd; hvd.init()
    >>> m = torch.nn.Linear(2, 1)
    >>> opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), named_parameters=m.named_parameters())
    >>> m(torch.ones(3, 2)).sum().backward(); opt.step()
    """
    group = group_of(process_set, "hvd.DistributedOptimizer()")
    if op == _ADASUM:
        raise NotImplementedError(
            "hvd.DistributedOptimizer(op=hvd.Adasum) is not supported by fluxmpi_py; use "
            "op=hvd.Average"
        )
    if op not in (_SUM, _AVERAGE):
        raise ValueError(f"hvd.DistributedOptimizer(op={op!r}): expected hvd.Average or hvd.Sum")
    if gradient_predivide_factor != 1.0 and op != _AVERAGE:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if not gradient_predivide_factor > 0:
        raise ValueError(
            f"gradient_predivide_factor must be > 0, got {gradient_predivide_factor!r}"
        )
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"hvd.DistributedOptimizer wraps a torch.optim.Optimizer, got {type(optimizer).__name__}"
        )
    _check_groups(groups, num_groups)
    named = _checked_names(optimizer, named_parameters)
    if group is not None and group.rank is None:
        outside = _OutsideSetOptimizer(optimizer)
        outside._parameter_names = _parameter_names(optimizer, named)
        return outside
    opt = _HorovodOptimizer(
        optimizer,
        op=op,
        compression=_wire(compression),
        backward_passes_per_step=backward_passes_per_step,
        named_parameters=named,
        group=group,
    )
    opt._parameter_names = _parameter_names(optimizer, named)
    # So that hvd.join() can take part in its steps (on the world, or on the set's group).
    (JOIN if group is None else set_join(group)).register(opt)
    return opt


def _parameter_names(optimizer, named) -> dict:
    """Horovod's ``optimizer._parameter_names`` (parameter -> name), which code written for
    Horovod reads (its own suite does): the given names, else ``allreduce.noname.{group}.{i}``."""
    if named is None:
        named = [
            (f"allreduce.noname.{i}.{j}", p)
            for i, group in enumerate(optimizer.param_groups)
            for j, p in enumerate(group["params"])
        ]
    return {p: n for n, p in sorted(named, key=lambda item: item[0])}


def join_state() -> JoinState:
    """hvd.join()'s bookkeeping of some optimizers: averaged over the world size (the set's
    size on a set), a joined rank counting as zeros, which also shadows allreduces."""
    state = JoinState(divide_by_initial_world_size=True, what="hvd.join")
    state.shadows_allreduces = True
    return state


#: hvd.join()'s world optimizers: every hvd.DistributedOptimizer without process_set=.
JOIN = join_state()

#: The same per process set: group -> its optimizers' JoinState.
SET_JOINS: dict = {}


def set_join(group) -> JoinState:
    """The JoinState of the ``process_set=`` optimizers on ``group`` (made on first use)."""
    if group not in SET_JOINS:
        SET_JOINS[group] = join_state()
    return SET_JOINS[group]


def _param_list(params):
    """Horovod's accepted ``params``: a dict (state_dict; sorted by key as Horovod does), or a
    list/iterable of tensors or (name, tensor) pairs."""
    if isinstance(params, dict):
        return sorted(params.items(), key=lambda kv: str(kv[0]))
    if isinstance(params, torch.Tensor) or not hasattr(params, "__iter__"):
        raise ValueError(f"invalid params of type: {type(params).__name__}")
    return [p if isinstance(p, tuple) else (f"params[{i}]", p) for i, p in enumerate(params)]


def broadcast_parameters(params, root_rank: int) -> None:
    """Overwrite, in place, every tensor of ``params`` with root_rank's (one fused broadcast).

    ``params``: ``model.state_dict()``, ``model.named_parameters()`` or a list of tensors.
    Every rank must pass the same names, shapes and dtypes (checked; ValueError on every rank).

    Args:
        params: ``model.state_dict()``, ``model.named_parameters()`` or a list of tensors.
        root_rank: the rank whose values every rank takes.

    >>> import torch, fluxmpi_py.horovod as hvd; hvd.init()
    >>> m = torch.nn.Linear(2, 1); hvd.broadcast_parameters(m.state_dict(), root_rank=0)
    """
    named = _param_list(params)
    for name, p in named:
        if p is not None and not isinstance(p, torch.Tensor):
            raise TypeError(
                f"broadcast_parameters: {name} is a {type(p).__name__}, not a tensor "
                "(use hvd.broadcast_object for other values)"
            )
    _gc.grouped_bcast_([p.detach() for _, p in named if p is not None], root_rank)


def broadcast_optimizer_state(optimizer, root_rank: int, model=None) -> None:
    """Give every rank root_rank's optimizer state and hyperparameters (``lr`` etc., also
    as tensors), in place. No optimizer step is taken: ranks whose state is still empty get
    the root's, and a rank with state the root lacks drops it. As after Horovod's dummy step,
    on a rank whose optimizer had no state yet, every parameter that requires grad and has no
    ``.grad`` gets a zero one (the next ``zero_grad()`` resets it); nothing else changes, and
    no weight moves (Horovod's dummy step applies weight decay to zero gradients).

    Args:
        optimizer: a torch optimizer, or an ``hvd.DistributedOptimizer``.
        root_rank: the rank whose state every rank takes.
        model: Horovod's older argument; not used.

    >>> import torch, fluxmpi_py.horovod as hvd; hvd.init()
    >>> opt = torch.optim.Adam(torch.nn.Linear(2, 1).parameters())
    >>> hvd.broadcast_optimizer_state(opt, root_rank=0)
    """
    if isinstance(optimizer, _FluxDistributedOptimizer):
        optimizer = optimizer.optimizer
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"broadcast_optimizer_state takes a torch.optim.Optimizer, got {type(optimizer).__name__}"
        )
    fresh = len(optimizer.state) == 0
    synchronize_(optimizer, root_rank)  # the wrapper reads the new groups and state through
    if fresh:
        with torch.no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.requires_grad and p.grad is None:
                        p.grad = torch.zeros_like(p)
