"""The one rule of the public calls' arguments (fluxmpi_py/runtime/entry.py): every public
callable says how it keeps the ranks in step, and a bad argument on one rank only, generated
from the API for every parameter of every public collective, raises on every rank
(tests/workers/bad_args_worker.py, at 2 and 3 ranks)."""

import inspect
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import worker_params  # noqa: E402

import fluxmpi_py as fm  # noqa: E402
import fluxmpi_py.horovod as hvd  # noqa: E402
from fluxmpi_py import collectives, data, runtime, sync, training  # noqa: E402
from fluxmpi_py.runtime.entry import entry_kind  # noqa: E402

FACES = [fm, hvd, collectives, data, runtime, sync, training]


def public_callables(module):
    for name in module.__all__:
        obj = getattr(module, name)
        if not callable(obj):
            continue
        if isinstance(obj, type) and issubclass(obj, (BaseException, Warning)):
            continue  # raised, not called
        yield name, obj


def user_classes():
    """The classes whose instances users hold: the faces' public classes, and every class of
    the package that derives from one of them or from torch's optimizer (the hvd optimizers,
    built by a factory), each once."""
    public = [obj for m in FACES for _, obj in public_callables(m) if isinstance(obj, type)]
    ours = [
        obj
        for name, mod in list(sys.modules.items())
        if name == "fluxmpi_py" or name.startswith("fluxmpi_py.")
        for obj in vars(mod).values()
        if isinstance(obj, type) and obj.__module__ == mod.__name__
    ]
    bases = (*public, torch.optim.Optimizer)
    found = public + [c for c in ours if issubclass(c, bases)]
    return list(dict.fromkeys(found))


def public_methods(cls):
    """(name, function) of each public method that the package defines for ``cls`` (torch's
    own, inherited, are torch's affair); properties are attributes, not calls."""
    for name in dir(cls):
        if name.startswith("_"):
            continue
        owner = next(k for k in cls.__mro__ if name in vars(k))
        attr = vars(owner)[name]
        if not owner.__module__.startswith("fluxmpi_py") or isinstance(attr, property):
            continue
        fn = getattr(attr, "__func__", attr)
        if callable(fn) and not isinstance(fn, type):
            yield name, fn


def test_every_public_method_says_how_it_keeps_the_ranks_in_step():
    # Issue 46's hole: opt.step() and the data classes' methods were not walked.
    classes = user_classes()
    assert fm.DistributedOptimizer in classes and fm.DistributedSampler in classes
    assert any(c.__module__.startswith("fluxmpi_py.integrations.horovod") for c in classes)
    unmarked = [
        f"{cls.__module__}.{cls.__qualname__}.{name}"
        for cls in classes
        for name, fn in public_methods(cls)
        if entry_kind(fn) is None
    ]
    assert not unmarked, (
        f"{unmarked} take none of the rule's decorators (fluxmpi_py/runtime/entry.py): "
        "entry_point, own_agreement, groups.group_dispatch or local_call"
    )
    kinds = {n: entry_kind(f) for n, f in public_methods(fm.DistributedOptimizer)}
    assert kinds["step"] == kinds["synchronize"] == "collective" and kinds["zero_grad"] == "local"
    assert inspect.isfunction(fm.DistributedOptimizer.step)


@pytest.mark.parametrize("module", FACES, ids=lambda m: m.__name__)
def test_every_public_callable_says_how_it_keeps_the_ranks_in_step(module):
    unmarked = [n for n, obj in public_callables(module) if entry_kind(obj) is None]
    assert not unmarked, (
        f"{module.__name__}: {unmarked} take none of the rule's decorators "
        "(fluxmpi_py/runtime/entry.py): entry_point, groups.group_dispatch or local_call"
    )


def test_the_collectives_are_marked_as_collectives():
    kinds = {n: entry_kind(obj) for n, obj in public_callables(fm)}
    assert kinds["allreduce_"] == kinds["allgather"] == kinds["barrier"] == "group"
    assert kinds["DistributedDataContainer"] == kinds["save_checkpoint"] == "collective"
    assert kinds["local_rank"] == kinds["Request"] == "local"
    assert entry_kind(hvd.allreduce_async) == "collective" and entry_kind(hvd.rank) == "local"


@pytest.mark.parametrize(
    "case", worker_params("bad_args_worker.py", [2, 3], timeout=300, bundle=False)
)
def test_a_bad_argument_on_one_rank_raises_on_every_rank(case):
    case.check_passed()


@pytest.mark.parametrize("case", worker_params("bad_method_args_worker.py", [2, 3], timeout=120))
def test_a_bad_method_argument_on_one_rank_raises_on_every_rank(case):
    # opt.step(closure=...), rebuild(...), SyncBatchNorm.forward(...): the methods marked as
    # collectives, found on the classes (tests/workers/bad_method_args_worker.py)
    case.check_passed()


@pytest.mark.parametrize("case", worker_params("bad_set_args_worker.py", [3], timeout=180))
def test_a_bad_argument_on_a_process_set_raises_on_its_ranks(case):
    # an error before the call entered its Horovod process set goes out on the set, where the
    # other members wait, not on the world (tests/workers/bad_set_args_worker.py)
    case.check_passed()


@pytest.mark.parametrize("case", worker_params("bad_grads_worker.py", [2, 3], timeout=120))
def test_a_gradient_one_rank_cannot_reduce_raises_on_every_rank(case):
    # backward's hooks: a parameter resized or cast since the plan, or a sparse gradient, on
    # one rank only, for every optimizer that reduces in the hooks (tests/workers/bad_grads_worker.py)
    case.check_passed()


@pytest.mark.parametrize(
    "case", worker_params("abandoned_pass_worker.py", [None, 2, 3], timeout=120)
)
def test_a_backward_pass_that_raises_on_one_rank_raises_at_every_rank_s_step(case):
    # autograd's own error in one rank's backward, after some of its gradient hooks ran
    # (fluxmpi_py/training/_abandoned_pass.py; tests/workers/abandoned_pass_worker.py)
    case.check_passed()


@pytest.mark.parametrize("case", worker_params("wrapped_step_worker.py", [None, 2, 3], timeout=120))
def test_a_wrapped_step_that_raises_on_one_rank_raises_at_every_rank_s_next_step(case):
    # the wrapped optimizer's own step raising on one rank, after the others applied theirs
    # (fluxmpi_py/training/_failed_step.py; tests/workers/wrapped_step_worker.py)
    case.check_passed()


def test_argument_errors_name_the_fix():
    # issue 50, given to the same rule: an unknown op lists every accepted name, and a module
    # where the optimizer belongs names the call to write instead.
    fm.Init()
    model = torch.nn.Linear(2, 1)
    with pytest.raises(ValueError, match="'sum', 'average', 'avg', 'mean'"):
        fm.allreduce_gradients(model, op="median")
    with pytest.raises(ValueError, match="'sum', 'average', 'avg', 'mean'"):
        fm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op="median")
    with pytest.raises(ValueError, match="sum, average, .*'avg' and 'mean' for average"):
        fm.allreduce_(torch.ones(1), op="median")
    fix = r"DistributedOptimizer\(torch.optim.SGD\(model.parameters\(\), lr=0.1\), module=model\)"
    with pytest.raises(TypeError, match=fix):
        fm.DistributedOptimizer(model)
