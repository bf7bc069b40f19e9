"""One training step that a lost rank costs once, not the job: :func:`elastic_step` (the
shrink mode, ``Init(on_failure="shrink")``; runtime/elastic.py has the world's side)."""

from __future__ import annotations

from typing import Any, Callable

import torch

from .._core import C
from ..runtime.elastic import RanksLostError, recover
from ..runtime.entry import local_call

__all__ = ["elastic_step"]


# It checks no argument of its own and calls step as given (step's collectives keep the rule);
# it communicates only in recover(), after every survivor got RanksLostError from one call.
@local_call
def elastic_step(
    step: Callable[..., Any],
    *args: Any,
    module: torch.nn.Module | None = None,
    optimizer: Any = None,
    on_recover: Callable[[dict], None] | None = None,
    **kwargs: Any,
) -> Any:
    """Run one training step, ``step(*args, **kwargs)``, so that a lost rank costs this step
    and not the job. In the shrink mode, when a rank is lost during it
    (:class:`RanksLostError`), the survivors :func:`recover`, put ``module``'s buffers and
    torch's random state back as the step found them, call ``on_recover(info)`` (rebuild what
    was made for the old world: ``optimizer.rebuild(...)``, the sampler's share of the data),
    and run the step again on the smaller world. A ``DistributedOptimizer`` applies a step on
    every survivor or on none (one agreement before the local update); a step that
    ``optimizer`` had applied when the loss came is not run again (None is returned). Outside
    the shrink mode it only calls ``step``.

    Args:
        step: the training step, a callable.
        *args: passed to ``step``.
        module: the model, whose buffers (BatchNorm's statistics) are put back as the step
            found them before it runs again; None: none.
        optimizer: the `DistributedOptimizer` of the step: a step it applied on every
            survivor before the loss is not run again; None: the step always runs again.
        on_recover: called with :func:`recover`'s dict before the step runs again, to rebuild
            what was made for the old world; None: nothing.
        **kwargs: passed to ``step``.

    Returns:
        What ``step`` returned; None when the step had been applied before the loss.

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> model = torch.nn.Linear(4, 2)
    >>> opt = fm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    >>> def train(x):
    ...     opt.zero_grad(); model(x).sum().backward(); opt.step()
    >>> fm.elastic_step(train, torch.randn(3, 4), module=model, optimizer=opt)
    """
    if not C.shrink_mode():
        return step(*args, **kwargs)
    saved = [b.detach().clone() for b in module.buffers()] if module is not None else []
    rng = torch.get_rng_state()
    applied = getattr(optimizer, "_applied_steps", None)
    while True:
        try:
            return step(*args, **kwargs)
        except RanksLostError:
            info = recover()
            if module is not None:
                with torch.no_grad():
                    for b, s in zip(module.buffers(), saved):
                        b.copy_(s)
            torch.set_rng_state(rng)
            if on_recover is not None:
                on_recover(info)
            if applied is not None and getattr(optimizer, "_applied_steps", None) != applied:
                return None  # applied on every survivor before the loss: done
