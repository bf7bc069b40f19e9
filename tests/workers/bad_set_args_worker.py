"""A bad argument on one rank only of a Horovod process set that is not the world (issue 46's
rule on process sets); run by tests/test_entry_points.py at 3 ranks.

Every Horovod collective with ``process_set=`` (from ``hvd.__all__``, as ``entry_kind`` marks
it, with the good calls of tests/workers/bad_args_worker.py) is called by the set's members
on the set of every rank but the last, with each parameter's bad values on its last member
only; the rank outside the set makes no call. An error raised before the call entered its set
must still go out on the set, where the other members wait: every member must end the call
alike, and one more collective on the world must then work (before the fix, such a verdict
went out on the world, and the members waited for ever).
"""

import inspect

from bad_args_worker import (
    HVD_GOOD,
    W,
    bad_values,
    communicating,
    ended_alike,
    not_an_argument_error,
    one_call,
    raise_failures,
)
from harness import run_cases

import fluxmpi_py.horovod as hvd

hvd.init()
RANK = hvd.rank()
LAST_MEMBER = W - 2
SET = None  # every rank but the last, while the case runs (a bundled launch shares hvd's sets)


def with_set(name):
    """``name``'s good call on the set, or None where it takes no ``process_set``."""
    fn = getattr(hvd, name)
    if HVD_GOOD.get(name) is None or "process_set" not in inspect.signature(fn).parameters:
        return None
    args, kwargs = HVD_GOOD[name]()
    kwargs["process_set"] = SET
    return args, kwargs


def try_bad(name, param, label, bad):
    fn = getattr(hvd, name)
    args, kwargs = with_set(name)
    if RANK == LAST_MEMBER:
        params = [p for p in inspect.signature(fn).parameters.values() if p.kind != p.VAR_KEYWORD]
        index = [p.name for p in params].index(param)
        if index < len(args):
            args[index] = bad
        else:
            kwargs[param] = bad
    outcome = one_call(hvd, name, fn, args, kwargs) if RANK < W - 1 else "outside"
    where = f"hvd.{name}({param}={label} on rank {LAST_MEMBER}, process_set=ranks 0..{W - 2})"
    ended_alike(where, outcome, members=W - 1)  # the set's ranks


def case_bad_arguments_on_a_process_set():
    global SET
    SET = hvd.add_process_set(list(range(W - 1)))
    try:
        walk_on_the_set()
    finally:
        hvd.remove_process_set(SET)
        SET = None


def walk_on_the_set():
    tried = 0
    for name in communicating(hvd):
        if with_set(name) is None:
            continue
        args, kwargs = with_set(name)
        params = list(inspect.signature(getattr(hvd, name)).parameters.values())
        for i, p in enumerate(params):
            if p.name == "process_set" or p.kind == p.VAR_KEYWORD:
                continue
            if not_an_argument_error(hvd, name, p.name):
                continue
            good = args[i] if i < len(args) else kwargs.get(p.name, p.default)
            for label, bad in bad_values(p.name, good):
                try_bad(name, p.name, label, bad)
                tried += 1
    assert tried > 100, tried
    raise_failures()  # BAD_ARGS_KEEP_GOING=1: every failure, at the end


if __name__ == "__main__":
    run_cases(globals())
