"""A backward pass that raised on one rank before its end: autograd's own error, a custom
Function's or a hook's, which this library never sees (it is raised to the user's code, on
that rank alone). The pass's gradient hooks had run, so its step's reduction may have begun:
the other ranks wait for the rest of it in ``step()``.

How it is seen: the first gradient hook of a pass queues the pass's end (:class:`PassEnd`, a
callback autograd runs when backward returns) and keeps a weak reference to it. Autograd drops
the callback unrun when the pass raises, so at the rank's next call into the optimizer
(``zero_grad()``, ``step()``, ``synchronize()``, or the first gradient hook of its next
backward pass) or into a collective (runtime/pending_steps.py) a pass whose callback is gone
and never ran was abandoned. (A backward nested in
another, as reentrant checkpointing runs, sees the outer pass's callback alive.) Outside any
backward, a pass whose callback has not run is abandoned too: autograd's device threads may
hold the failed pass (and its callback) a moment after ``backward()`` raised.

What is done: the step that pass belonged to is applied on no rank, and every rank raises,
through the mechanism that carries a hook's error (the byte in the step's last allreduce, or
the step's agreement; no collective of its own). The rank completes the step's collectives,
with the error, so that the others' ``step()`` raises it naming this rank:

- at ``step()`` or ``synchronize()``, which raise it here too;
- at ``zero_grad()`` (the step is dropped), which warns with it instead: this rank has had
  backward's exception already, and a loop that caught it and goes on stays in step;
- at the next backward's first hook, or a collective's entry, when the pass was the step's
  last (its gradients were being reduced; it warns). After an earlier pass, or one inside ``no_sync()``, the
  next pass goes on with the step (nothing of it has moved): the error is noted, and the
  step's reduction raises it on every rank at ``step()``.

Then the step's state is reset, and the next step runs on every rank.
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any, Callable

import torch

from ..runtime.agreement import raised_on_every_rank
from ..runtime.entry import local_call
from ..runtime.groups import on_group
from ..runtime.pending_steps import mark_open

#: What every rank is told (after "DistributedOptimizer.step(): rank R: ").
ABANDONED = (
    "its backward pass raised (that rank's own error: autograd's, a custom Function's or a "
    "hook's) before its gradients were complete; this step was applied on no rank. Zero the "
    "gradients and go on: the next step runs on every rank"
)


class PassEnd:
    """The end of one backward pass: the callback its first gradient hook queues, which runs
    ``run`` when the pass returns; autograd drops it unrun when the pass raises (a weak
    reference then tells)."""

    __slots__ = ("run", "__weakref__")

    def __init__(self, run: Callable[[], None]):
        self.run = run

    def __call__(self) -> None:
        self.run()


class AbandonedPasses:
    """What :class:`fluxmpi_py.DistributedOptimizer` does about a backward pass that raised on
    its rank (a mixin: the attributes are the optimizer's)."""

    _group: Any
    _exact: Any
    _passes: int
    _synchronized: bool
    _reduce: Callable[..., None]
    _last_pass: Callable[[], bool]
    _end_of_backward: Callable[[], None]
    _pass_end_ref: weakref.ReferenceType | None = None
    _pass_last: bool = False  # the open pass is its step's last: it reduces
    #: a pass of this step raised before the step's reduction began: raised by that reduction
    _broken: Exception | None = None

    @property
    def _pass_end(self) -> weakref.ReferenceType | None:
        """The open pass's end (None: no pass open); dead and unrun: the pass raised. While
        one is open, this rank's collectives first settle it (runtime/pending_steps.py)."""
        return self._pass_end_ref

    @_pass_end.setter
    def _pass_end(self, end: weakref.ReferenceType | None) -> None:
        self._pass_end_ref = end
        mark_open(self, end is not None)

    def _settle_before_collective(self) -> None:
        """Before a collective of this rank's own: a pass that raised is settled as at the next
        backward's first hook (the step completed if that pass was its last, with a warning;
        else its error noted for the step's reduction)."""
        _warn(self._settle_abandoned(complete=self._pass_last), stacklevel=5)

    def _open_pass(self, param: torch.Tensor) -> None:
        """The first gradient hook of a backward pass (``param``'s): settle the pass before
        it if that one raised, then queue this pass's end."""
        if self._pass_end is not None:  # a pass whose callback is gone, unrun
            # its gradient of this pass, as backward gave it (the settling may reduce into it)
            saved = param.grad
            if saved is not None:
                saved = saved.detach().clone()
            error = self._settle_abandoned(complete=self._pass_last)
            param.grad = saved
            _warn(error, stacklevel=4)  # the hook, in backward
        end = PassEnd(self._end_of_backward)
        self._pass_end = weakref.ref(end)
        exact = self._exact
        self._pass_last = self._last_pass() or (exact is not None and exact.passes >= exact.k - 1)
        torch.autograd.Variable._execution_engine.queue_callback(end)

    def _settle_abandoned(self, complete: bool = True) -> BaseException | None:
        """At this rank's calls into the optimizer: if a backward pass raised since the last,
        settle its step (see the module's docstring): complete its collectives, or with
        ``complete`` False, note its error for them. Returns the error raised on every rank
        where the step's collectives were completed here, else None."""
        end = self._pass_end
        if end is None or (end() is not None and _in_backward()):  # none open, or running
            return None
        self._pass_end = None
        error = RuntimeError(ABANDONED)
        if not complete:  # the next pass goes on with the step: its reduction raises it
            if self._broken is None:
                self._broken = error
            return None
        try:
            with on_group(self._group, "DistributedOptimizer.step()"):
                self._reduce(error)
        except Exception as e:
            if e is not error and not raised_on_every_rank(e):  # (a world of one: error)
                raise
            return e
        finally:
            self._passes, self._synchronized = 0, False
        raise AssertionError("the step's reduction did not raise the noted error")

    def _raise_abandoned(self) -> None:
        """``step()`` and ``synchronize()``: a pass that raised, whose step's collectives are
        completed here, raises here (on every rank)."""
        settled = self._settle_abandoned()
        if settled is not None:
            raise settled

    @local_call
    def zero_grad(self, set_to_none: bool = True) -> None:
        """As torch's ``zero_grad``. If this rank's last backward pass raised, it first
        completes the step's collectives, with the others, which then raise in ``step()``;
        here it warns (this rank has had backward's exception), so that a loop that caught it
        goes on in step.

        Args:
            set_to_none: as torch's: None instead of zeros.

        >>> import torch, fluxmpi_py as fm; fm.Init()
        >>> model = torch.nn.Linear(2, 1)
        >>> opt = fm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        >>> model(torch.ones(1, 2)).sum().backward(); opt.step()
        >>> opt.zero_grad(); model.weight.grad is None
        True
        """
        _warn(self._settle_abandoned(), stacklevel=3)
        super().zero_grad(set_to_none=set_to_none)  # type: ignore[misc]


_graph_task_id = getattr(torch._C, "_current_graph_task_id", None)  # -1: in no backward


def _in_backward() -> bool:
    """Whether this thread runs a backward pass now (True where torch cannot tell)."""
    return _graph_task_id is None or _graph_task_id() != -1


def _warn(error: BaseException | None, stacklevel: int) -> None:
    if error is not None:
        warnings.warn(str(error), RuntimeWarning, stacklevel=stacklevel)
