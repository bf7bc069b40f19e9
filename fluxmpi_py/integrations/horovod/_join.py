"""``hvd.join()``: Horovod's joined ranks take part in the others' ``hvd.allreduce`` (and its
in-place, async and grouped forms, and every other ``allreduce_`` of fluxmpi_py) with zeros,
and in their ``hvd.DistributedOptimizer`` steps: on the world and on every process set
(``process_set=``) the joined rank is a member of.

A joined rank waits in the others' agreements, the one small allreduce every collective
starts with (``csrc/ops/consensus.h``), with a mark instead of a signature
(``csrc/ops/join.h``). While no rank has joined the mark is four int64 lanes more in that
allreduce, so a world ``hvd.allreduce`` costs what it cost without join support: measured
23 us against 20 us for ``allreduce_`` of a clone at 1 KiB, where the join round each
allreduce took before cost 69 us against 20 us with the round switched off; 1.55 ms against
1.87 ms at 1 MiB, before 1.73 ms against 1.53 ms (2 ranks on 2 shared cores,
``benchmarks/bench_hvd_join.py``, one launch each, before and after; docs/measurements.md).
Once a rank has joined, the active ranks' allreduce sends what it moves (dtypes, element
counts: one more 272-byte allreduce) and the joined ranks reduce zeros of that with them.
Averages divide by the world size, or the set's size on a set (a joined rank counts as
zeros). Other collectives issued while a rank of their set has joined raise on the active
ranks (Horovod's semantics), naming the joined rank and the set; the joined ranks keep
waiting. The last rank to join is the one that joined at the latest world agreement (the
highest on a tie).

Process sets: the joined rank waits on the world on the calling thread and on each of its
sets (registered ones, and those ``process_set=`` optimizers were made on) on a thread of its
own, that set's group current there; MPI_THREAD_MULTIPLE lets blocking collectives on
different communicators run at once. A set's thread ends when every member of the set has
joined, so all have ended once every rank has; ``join()`` returns after them. An error that
a set's active ranks raised too (a shadowed step they disagree on) is raised by ``join()``
then, the set's thread waiting on meanwhile; an error of this rank alone ends the job (the
set's others would wait for it forever). Neither these waits nor the optimizer steps they
shadow hold the engine while they block. Every member must have the same sets registered when
it joins (sets are removed on every rank). Without MPI_THREAD_MULTIPLE only the world is
waited on (a collective on a set with a joined member then waits until the timeout).
"""

from __future__ import annotations

from ...runtime.world import build_info
from ...training.join import JoinState, wait_for_all
from ._handles import start_waiting
from ._optimizer import JOIN, SET_JOINS, join_state
from ._process_sets import member_groups


def join() -> int:
    """Wait as a joined rank until every rank has joined; return the last one to join. This
    rank's named async calls still waiting to be matched by name start first."""
    start_waiting()
    return wait_for_all(JOIN, "hvd.join", sets=_sets())


def _sets() -> list[tuple[object, JoinState]]:
    """(group, JoinState) of every process set of several ranks this rank is in: the
    registered ones and those that ``process_set=`` optimizers were made on (one per group).
    Every member must find the same ones: sets are registered and removed on every rank, and
    an optimizer is made on every member, so liveness is never asked (garbage collection runs
    at different times on different ranks). Without MPI_THREAD_MULTIPLE the wait is on the
    world only (a set's collective then hangs until the timeout)."""
    if not build_info()["thread_multiple"]:
        return []
    groups = member_groups()
    groups += [g for g in SET_JOINS if g not in groups]
    return [
        (g, SET_JOINS[g] if g in SET_JOINS else join_state())  # no optimizers: empty
        for g in groups
        if g.size > 1 and g.rank is not None
    ]
