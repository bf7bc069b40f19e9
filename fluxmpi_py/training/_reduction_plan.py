"""The gradient reduction plan shared by DistributedOptimizer and allreduce_gradients: which
parameters are reduced (those that require grad), checked across ranks, and re-planned on
every rank together when some rank freezes or unfreezes a parameter.

Noticing the change costs no collective of its own: each rank compares its parameters'
``requires_grad`` with the plan's (a local check), and the result rides as one more byte in
the "which gradients exist anywhere" allreduce that ends every reduction. When any rank
changed, every rank re-plans (a collective check that names the parameter where ranks
disagree), then reduces, once, the gradients of the parameters that just joined the plan:
they were accumulated without a hook in this step's backward.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import torch

from .._core import C
from ..runtime.agreement import hash64, require_same, span
from ..runtime.entry import error_class, raise_noted

_requires_grad = operator.attrgetter("requires_grad")


def describe(name: str, p: torch.Tensor) -> str:
    """One parameter as the cross-rank check compares and names it."""
    return (
        f"{name}: shape {tuple(p.shape)}, dtype {str(p.dtype).replace('torch.', '')}, "
        f"device {p.device.type}, requires_grad={p.requires_grad}"
    )


def check_same_parameters(names: Sequence[str], params: Sequence[torch.Tensor], what: str) -> int:
    """Collective: verify every rank holds the same parameter list (with the same
    requires_grad flags); return its hash.

    On a difference every rank raises ValueError naming the first parameter (in the order
    the optimizer lists them) that differs, the rank that has it and rank 0's version of it.
    """
    descs = [describe(n, p) for n, p in zip(names, params)]
    require_same(
        descs,
        what,
        "parameters",
        "parameter",
        ". Every rank must build the same model and optimizer (same parameters, order, "
        "shapes, dtypes and requires_grad) and freeze or unfreeze the same parameters "
        "before the same step.",
    )
    return hash64("\n".join(descs))


class ReductionPlan:
    """The parameters of ``named`` that require grad, in backward order, and the compiled
    reducer for them, planned and run with ``options`` (a ``C.ReducerOptions``, its
    ``plan_hash`` set here). Constructing it (and ``replan``) is a collective.

    ``reduces=False`` (``DistributedOptimizer(deterministic=True)``, whose exact sums reduce
    the gradients): the order and the requires_grad watch only; its reducer plans no bucket
    and holds no buffer."""

    def __init__(
        self,
        named: Sequence[tuple[str, torch.Tensor]],
        what: str,
        options: C.ReducerOptions,
        *,
        reduces: bool = True,
    ):
        self._what = what
        self._options = options
        self._reduces = reduces
        self.replan(named)

    def replan(self, named: Sequence[tuple[str, torch.Tensor]]) -> list[torch.Tensor]:
        """Plan ``named`` afresh (a collective); return the parameters that joined the plan."""
        names = [n for n, _ in named]
        params = [p for _, p in named]
        flags = list(map(_requires_grad, params))
        h = check_same_parameters(names, params, self._what)
        o = self._options
        self._hash = hash64("\n".join(map(str, (h, o.op, o.compression, o.plan))))
        before = set(map(id, getattr(self, "order", ())))
        # Backward produces gradients roughly in reverse registration order: plan buckets so.
        self.order = [p for p, f in zip(params, flags) if f][::-1]
        reduced = self.order if self._reduces else []
        self.reducer = C.GradientReducer(reduced, self._reducer_options(self._hash))
        if self._reduces:
            self.reducer.name_parameters([n for n, f in zip(names, flags) if f][::-1])
        self.reducer.watch_requires_grad(params)
        return [p for p in self.order if id(p) not in before]

    def requires_grad_changed(self) -> bool:
        """Local: does some parameter's requires_grad differ from the plan's? (~1 ns a
        parameter, in the compiled reducer)"""
        return self.reducer.requires_grad_changed()

    def finalize(self, changed: bool, error: Exception | None = None) -> bool:
        """Finish this step's reduction; return whether ``changed`` is true on any rank.
        ``error``: this rank's error in the call (a bad argument of ``step()``), which the
        reduction carries: every rank raises it."""
        if self.order:
            if error is None:
                return self.reducer.finalize(changed)
            return self.reducer.finalize(changed, str(error), error_class(error))
        # nothing to reduce: a byte of its own, and one for some rank's error
        ((_, anywhere), (_, failed)) = span([int(changed), int(error is not None)])
        if failed:
            raise_noted(error, "DistributedOptimizer.step()")
        return bool(anywhere)

    def reduce_once(self, params: Sequence[torch.Tensor]) -> None:
        """Reduce these planned parameters' gradients now, as a step's reduction would
        (a collective; ``params`` is the same list on every rank)."""
        if not params:
            return
        h = hash64(f"{self._hash} once {len(params)}")
        C.GradientReducer(list(params), self._reducer_options(h)).finalize()

    def _reducer_options(self, plan_hash: int):
        o = self._options
        return C.ReducerOptions(
            plan=o.plan, op=o.op, compression=o.compression, plan_hash=plan_hash
        )


def named_candidates(param_groups, names: dict) -> list[tuple[str, torch.Tensor]]:
    """Every parameter of an optimizer's groups, named from ``names`` (id -> name) or by
    position (``param_groups[g][i]``)."""
    return [
        (names.get(id(p), f"param_groups[{g}][{i}]"), p)
        for g, group in enumerate(param_groups)
        for i, p in enumerate(group["params"])
    ]


def replan_if_changed(
    plan: ReductionPlan, changed: bool, named_now, error: Exception | None = None
) -> list[torch.Tensor] | None:
    """End a step's reduction; when any rank changed, re-plan from ``named_now()`` and reduce
    the parameters that joined. Returns the new plan's order when it re-planned, else None.
    ``error``: as :meth:`ReductionPlan.finalize`'s."""
    if not plan.finalize(changed, error):
        return None
    joined = plan.replan(named_now())
    plan.reduce_once(joined)
    return plan.order
