"""``import fluxmpi_py.horovod as hvd``: Horovod's ``horovod.torch`` names on fluxmpi_py.

Covers the world process set: init, topology and build predicates; allreduce (ops,
averaging, pre/post scaling), allgather, broadcast, alltoall, reducescatter, their async and
grouped forms with ``synchronize``/``poll``; the object collectives; ``DistributedOptimizer``,
``Compression``, ``broadcast_parameters``, ``broadcast_optimizer_state`` and ``SyncBatchNorm``.
Process sets (``hvd.ProcessSet``, ``add_process_set``, ``process_set=``) run on
:func:`fluxmpi_py.new_group` sub-groups. Adasum raises a clear error naming the alternative.

>>> import torch, fluxmpi_py.horovod as hvd; hvd.init()
>>> hvd.allreduce(torch.ones(2)).tolist()
[1.0, 1.0]
"""

from __future__ import annotations

import torch

import fluxmpi_py as _fm

from ...training import SyncBatchNorm  # hvd.SyncBatchNorm is fluxmpi_py's
from . import (
    _collectives,
    _extras,
    _gradients,
    _handles,
    _join,
    _optimizer,
    _process_sets,
    _reducescatter,
    _topology,
)
from ._collectives import *  # noqa: F403
from ._extras import *  # noqa: F403
from ._handles import _in_set, named, start_async
from ._ops import Adasum, Average, Max, Min, Product, Sum, _integer_average, _op, _root, _scale_
from ._optimizer import *  # noqa: F403
from ._process_sets import *  # noqa: F403
from ._reducescatter import *  # noqa: F403
from ._rule import give_the_rule
from ._topology import *  # noqa: F403

# The private submodules' examples run as this package's (tests/test_doctests.py runs packages).
__test__ = {
    n: getattr(m, n)
    for m in (_collectives, _extras, _optimizer, _process_sets, _reducescatter, _topology)
    for n in m.__all__
    if callable(getattr(m, n)) and n != "elastic"  # not hvd.global_process_set
}

__all__ = [
    "Sum",
    "Average",
    "Min",
    "Max",
    "Product",
    "Adasum",
    "HorovodInternalError",
    "init",
    "shutdown",
    "is_initialized",
    "rank",
    "size",
    "local_rank",
    "allreduce",
    "allreduce_",
    "broadcast",
    "broadcast_",
    "allgather",
    "barrier",
    "allreduce_async",
    "allreduce_async_",
    "poll",
    "synchronize",
    "join",
    "broadcast_object",
    "allgather_object",
    "SyncBatchNorm",
    *_collectives.__all__,
    *_extras.__all__,
    *_optimizer.__all__,
    *_process_sets.__all__,
    *_reducescatter.__all__,
    *_topology.__all__,
]


class HorovodInternalError(RuntimeError):
    """Horovod's error type for a failed collective, for code that catches it.

    >>> import fluxmpi_py.horovod as hvd; issubclass(hvd.HorovodInternalError, RuntimeError)
    True
    """


def init(comm=None, process_sets=None) -> None:
    """Start the runtime (idempotent). ``comm``: an mpi4py communicator, as in Horovod;
    ``process_sets``: ProcessSets (or lists of ranks) to register, as ``add_process_set``.

    Args:
        comm: an mpi4py communicator, to run on its ranks only; None: the whole job.
        process_sets: ProcessSets (or lists of ranks) to register, as ``add_process_set``.

    >>> import fluxmpi_py.horovod as hvd; hvd.init(); hvd.is_initialized()
    True
    """
    _fm.Init(comm=comm)
    _topology.learn()
    _process_sets._on_init(process_sets)
    _SHUT_DOWN.clear()


# Set by shutdown(), cleared by init(): Horovod's is_initialized() is False in between.
_SHUT_DOWN: list = []


def shutdown() -> None:
    """Horovod's shutdown: the runtime ends at interpreter exit, so this waits on a barrier;
    :func:`is_initialized` is False until the next :func:`init`.

    >>> import fluxmpi_py.horovod as hvd; hvd.init(); hvd.shutdown(); hvd.is_initialized()
    False
    """
    if _fm.Initialized() and not _SHUT_DOWN:
        _fm.barrier()
    _SHUT_DOWN.append(True)


def is_initialized() -> bool:
    """Whether :func:`init` has run (and no :func:`shutdown` since).

    >>> import fluxmpi_py.horovod as hvd; hvd.init(); hvd.is_initialized()
    True
    """
    return _fm.Initialized() and not _SHUT_DOWN


def rank() -> int:
    """This process's rank in the world.

    >>> import fluxmpi_py.horovod as hvd; hvd.init(); 0 <= hvd.rank() < hvd.size()
    True
    """
    return _fm.local_rank()


def size() -> int:
    """The number of processes.

    >>> import fluxmpi_py.horovod as hvd; hvd.init(); hvd.size() >= 1
    True
    """
    return _fm.total_workers()


def local_rank() -> int:
    """This process's rank on its node.

    >>> import fluxmpi_py.horovod as hvd; hvd.init(); hvd.local_rank() >= 0
    True
    """
    return _fm.node_local_rank()


def allreduce_(
    tensor,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=None,
):
    """Reduce ``tensor`` in place over every rank of ``process_set`` (default: the world;
    default op: average) and return it. Integer tensors are scaled in float64, and their
    average truncated toward zero, as Horovod's.

    >>> import torch, fluxmpi_py.horovod as hvd; hvd.init()
    >>> hvd.allreduce_(torch.ones(2), op=hvd.Sum).tolist() == [hvd.size()] * 2
    True
    """
    call = "hvd.allreduce_()"
    with named(name, process_set, call, hold=False), _in_set(process_set, call):
        op, postscale_factor = _integer_average(_op(average, op), [tensor], postscale_factor)
        _fm.allreduce_(_scale_(tensor, prescale_factor), op)
        return _scale_(tensor, postscale_factor)


def allreduce(
    tensor,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=None,
):
    """The reduction of ``tensor`` over every rank, in a new tensor (default: average).
    Differentiable, as Horovod's: the gradient is the same reduction of the output's.

    >>> import torch, fluxmpi_py.horovod as hvd; hvd.init()
    >>> hvd.allreduce(torch.ones(2)).tolist()
    [1.0, 1.0]
    """
    if isinstance(tensor, torch.Tensor) and tensor.requires_grad and torch.is_grad_enabled():
        call = "hvd.allreduce()"
        with named(name, process_set, call, hold=False), _in_set(process_set, call):
            x = tensor * prescale_factor if prescale_factor != 1.0 else tensor
            op = _op(average, op)
            out = _fm.allreduce(x, op)
            return out * postscale_factor if postscale_factor != 1.0 else out
    return allreduce_(
        tensor.detach().clone(), average, name, op, prescale_factor, postscale_factor, process_set
    )


def barrier(process_set=None) -> None:
    """Wait until every rank of ``process_set`` (default: the world) gets here. Named
    ``_async`` calls of the set that wait to start (see :func:`synchronize`) and that every
    rank has made start first, so that ranks may make them on different sides of a barrier.

    >>> import fluxmpi_py.horovod as hvd; hvd.init(); hvd.barrier()
    """
    _handles.round_on(process_set, "hvd.barrier()")  # named async calls on both sides meet
    with _in_set(process_set, "hvd.barrier()"):
        _fm.barrier()
    _handles.settled()


def join(device=-1) -> int:
    """This rank ran out of data: until every rank has joined, take part in the others'
    ``hvd.DistributedOptimizer`` steps with zero gradients (applying the reduced steps too,
    so all ranks end with the same weights) and in their ``hvd.allreduce`` calls (all forms)
    with zeros, on the world and on every process set this rank is in; return the last rank to
    join. Averages divide by the world size (the set's size on a set; a joined rank counts as
    zeros). Other collectives, issued while some rank of their set has joined, raise on the
    ranks that issued them; the joined ranks keep waiting (see :mod:`._join`).

    Args:
        device: Horovod's device for the join's collectives; accepted and not needed here.

    Returns:
        The last rank to join.

    >>> import fluxmpi_py.horovod as hvd; hvd.init(); hvd.join() == hvd.size() - 1
    True
    """
    return _join.join()


def broadcast_object(obj, root_rank=0, name=None, process_set=None):
    """root_rank's ``obj`` (pickled) on every rank of ``process_set``.

    Args:
        obj: the object to send, read on ``root_rank`` only; it must pickle.

    >>> import fluxmpi_py.horovod as hvd; hvd.init()
    >>> hvd.broadcast_object({"epoch": 3 + hvd.rank()}, root_rank=0)
    {'epoch': 3}
    """
    call = "hvd.broadcast_object()"
    with named(name, process_set, call, hold=False):
        group, root = _root(process_set, root_rank, call)
        return _fm.broadcast_object(obj, root, group=group)


def allgather_object(obj, name=None, process_set=None):
    """Every rank's ``obj`` (pickled), in rank order.

    Args:
        obj: this rank's object; it must pickle.

    >>> import fluxmpi_py.horovod as hvd; hvd.init()
    >>> hvd.allgather_object(hvd.rank()) == list(range(hvd.size()))
    True
    """
    call = "hvd.allgather_object()"
    with named(name, process_set, call, hold=False):
        return _fm.allgather_object(obj, group=_process_sets.group_of(process_set, call))


def broadcast_(tensor, root_rank, name=None, process_set=None):
    """Overwrite ``tensor`` with root_rank's (a world rank, also with ``process_set``), in
    place, and return it.

    >>> import torch, fluxmpi_py.horovod as hvd; hvd.init()
    >>> hvd.broadcast_(torch.full((2,), float(hvd.rank())), 0).tolist()
    [0.0, 0.0]
    """
    call = "hvd.broadcast_()"
    with named(name, process_set, call, hold=False):
        group, root = _root(process_set, root_rank, call, tensor)
        return _fm.bcast_(tensor, root, group=group)


def broadcast(tensor, root_rank, name=None, process_set=None):
    """root_rank's ``tensor``, in a new tensor. Differentiable, as Horovod's (the root's
    gradient is the average of every rank's output gradient; the others' is zero).

    >>> import torch, fluxmpi_py.horovod as hvd; hvd.init()
    >>> hvd.broadcast(torch.full((2,), float(hvd.rank())), 0).tolist()
    [0.0, 0.0]
    """
    if isinstance(tensor, torch.Tensor) and tensor.requires_grad and torch.is_grad_enabled():
        call = "hvd.broadcast()"
        with named(name, process_set, call, hold=False):
            group, root = _root(process_set, root_rank, call, tensor)
            n = size() if group is None else group.size
            return _fm.broadcast(_gradients.averaged_gradient(tensor, n), root, group=group)
    return broadcast_(tensor.detach().clone(), root_rank, name, process_set)


def allgather(tensor, name=None, process_set=None):
    """Every rank's ``tensor`` concatenated along dim 0 (which may differ by rank).
    Differentiable, as Horovod's: this rank's rows of the average of every rank's output
    gradient.

    >>> import torch, fluxmpi_py.horovod as hvd; hvd.init()
    >>> hvd.allgather(torch.ones(1, 2)).shape[0] == hvd.size()
    True
    """
    call = "hvd.allgather()"
    with named(name, process_set, call, hold=False):
        group = _process_sets.group_of(process_set, call)
        if _gradients.needs_grad([tensor]):
            tensor = _gradients.averaged_gradient(tensor, size() if group is None else group.size)
        return _fm.allgather(tensor, group=group)


def allreduce_async_(
    tensor,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=None,
):
    """Start :func:`allreduce_` in the background; :func:`synchronize` returns the tensor.

    >>> import torch, fluxmpi_py.horovod as hvd; hvd.init()
    >>> hvd.synchronize(hvd.allreduce_async_(torch.ones(2))).tolist()
    [1.0, 1.0]
    """
    call = "hvd.allreduce_async_()"
    op = _op(average, op)  # Horovod's argument errors raise here, not at the start

    def start():
        reduce, post = _integer_average(op, [tensor], postscale_factor)
        req = _fm.Iallreduce(_scale_(tensor, prescale_factor), reduce)
        return req, lambda t: _scale_(t, post)

    return start_async(name, process_set, call, start)


def allreduce_async(
    tensor,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=None,
):
    """Start :func:`allreduce` in the background; :func:`synchronize` returns the result.

    >>> import torch, fluxmpi_py.horovod as hvd; hvd.init()
    >>> hvd.synchronize(hvd.allreduce_async(torch.ones(2), op=hvd.Sum)).tolist() == [hvd.size()] * 2
    True
    """
    return allreduce_async_(
        tensor.detach().clone(), average, name, op, prescale_factor, postscale_factor, process_set
    )


def poll(handle) -> bool:
    """Whether the collective behind ``handle`` is done. It never waits for the collective;
    a named ``_async`` call that has not started yet runs one round with the other ranks of
    its process set (a small collective: they poll or synchronize too) and starts there when
    every rank has made a call of that name.

    >>> import torch, fluxmpi_py.horovod as hvd; hvd.init()
    >>> h = hvd.allreduce_async(torch.ones(2)); hvd.synchronize(h).shape, hvd.poll(h)
    (torch.Size([2]), True)
    """
    return _handles.poll_started(handle)


def synchronize(handle):
    """Wait for the collective behind ``handle`` and return its result. A named ``_async``
    call that has not started yet starts when every rank of its process set has made one of
    that name (Horovod's matching by name): until then this runs rounds with the set's other
    ranks (each a small collective), and raises on every rank when all of them wait on names
    that the others never made.

    >>> import torch, fluxmpi_py.horovod as hvd; hvd.init()
    >>> hvd.synchronize(hvd.allreduce_async(torch.ones(1))).tolist()
    [1.0]
    """
    return _handles.synchronize_now(handle)


# The rule of every public call (fluxmpi_py/runtime/entry.py), given to each of the face's
# callables here, so that a new one gets it without a decorator to remember: a collective's
# bad argument on one rank raises on every rank. These do not communicate (or not always:
# poll and synchronize of a finished handle), so their errors stay on their rank.
_LOCAL = {
    "init",  # its Init agrees on its own
    "is_initialized",
    "rank",
    "size",
    "local_rank",
    "poll",
    "synchronize",
    "start_timeline",
    "stop_timeline",
    "get_process_sets",
    *_topology.__all__,
}
give_the_rule(globals(), __all__, _LOCAL)
