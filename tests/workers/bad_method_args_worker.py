"""A bad argument on one rank only, given to the methods of the public classes that
communicate (issue 46's rule for ``opt.step(closure)`` and the like); run by
tests/test_entry_points.py at 2 and 3 ranks.

The methods come from the classes, as ``entry_kind`` marks them ("collective"), not from a
list: each gets a good instance and call from METHOD_GOOD (a new collective method without
one fails case_every_collective_method_has_a_good_call). Then every parameter gets the bad
values of tests/workers/bad_args_worker.py on the last rank only; every rank must end the call
alike (all raise one family, or all return), the binding's raw text is never what a user
reads, and one more collective then works.
"""

import inspect

import torch
from bad_args_worker import (
    LAST,
    RANK,
    RAW_BINDING_TEXT,
    bad_values,
    ended_alike,
    family,
    raise_failures,
)
from harness import fm, run_cases

import fluxmpi_py.horovod as hvd
from fluxmpi_py.runtime.entry import entry_kind

hvd.init()


def model():
    torch.manual_seed(0)
    return torch.nn.Linear(3, 2)


def after_backward(make):
    """An optimizer from ``make(model)`` whose step's reduction began in backward's hooks."""
    m = model()
    opt = make(m)
    m(torch.ones(2, 3)).sum().backward()
    return opt


def fm_opt(m):
    return fm.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1))


def hvd_opt(m):
    return hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1))


def sync_bn():
    bn = fm.SyncBatchNorm(3)
    bn.train()
    return bn


# (class, method) -> a good call: (instance, args, kwargs). The same on every rank.
METHOD_GOOD = {
    (fm.DistributedOptimizer, "step"): lambda: (after_backward(fm_opt), [], {"closure": None}),
    (fm.DistributedOptimizer, "synchronize"): lambda: (after_backward(fm_opt), [], {}),
    (fm.DistributedOptimizer, "rebuild"): lambda: (
        fm_opt(model()),
        [],
        {"backward_passes_per_step": 1},
    ),
    (fm.SyncBatchNorm, "forward"): lambda: (sync_bn(), [torch.ones(4, 3)], {}),
    (type(hvd_opt(model())), "step"): lambda: (after_backward(hvd_opt), [], {"closure": None}),
    (type(hvd_opt(model())), "synchronize"): lambda: (after_backward(hvd_opt), [], {}),
    (type(hvd_opt(model())), "rebuild"): lambda: (
        hvd_opt(model()),
        [],
        {"backward_passes_per_step": 1},
    ),
}


def collective_methods():
    """(class, name) of every method that a public class of fm or hvd (or the optimizer that
    hvd.DistributedOptimizer builds) marks as a collective."""
    classes = [getattr(face, n) for face in (fm, hvd) for n in face.__all__]
    classes = [c for c in classes if isinstance(c, type)] + [type(hvd_opt(model()))]
    out = []
    for cls in dict.fromkeys(classes):
        for name in dir(cls):
            attr = inspect.getattr_static(cls, name)
            fn = getattr(attr, "__func__", attr)
            if not name.startswith("_") and callable(fn) and entry_kind(fn) == "collective":
                if not isinstance(fn, type):
                    out.append((cls, name))
    return out


def case_every_collective_method_has_a_good_call():
    missing = [f"{c.__name__}.{n}" for c, n in collective_methods() if (c, n) not in METHOD_GOOD]
    assert not missing, f"give these collective methods a good call in METHOD_GOOD: {missing}"


def try_bad(cls, name, param, label, bad):
    obj, args, kwargs = METHOD_GOOD[(cls, name)]()
    if RANK == LAST:
        kwargs.pop(param, None)
        params = list(inspect.signature(getattr(obj, name)).parameters)
        if param in params[: len(args)]:
            args[params.index(param)] = bad
        else:
            kwargs[param] = bad
    try:
        getattr(obj, name)(*args, **kwargs)
        outcome = "returned"
    except Exception as e:  # noqa: BLE001 - the family is what every rank must share
        outcome = ("raw: " + str(e),) if RAW_BINDING_TEXT in str(e) else family(e)
    ended_alike(f"{cls.__name__}.{name}({param}={label} on rank {LAST})", outcome)


def case_collective_methods():
    tried = 0
    for cls, name in collective_methods():
        if (cls, name) not in METHOD_GOOD:
            continue
        obj, args, kwargs = METHOD_GOOD[(cls, name)]()
        sig = inspect.signature(getattr(obj, name))
        for i, p in enumerate(sig.parameters.values()):
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            good = args[i] if i < len(args) else kwargs.get(p.name, p.default)
            for label, bad in bad_values(p.name, good):
                if bad is None and good is None:
                    continue  # the good value itself
                try_bad(cls, name, p.name, label, bad)
                tried += 1
    assert tried >= 30, tried
    raise_failures()  # BAD_ARGS_KEEP_GOING=1: every failure, at the end


if __name__ == "__main__":
    run_cases(globals())
