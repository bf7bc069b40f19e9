"""pybind11's own text for arguments a compiled call cannot convert ("incompatible function
arguments") never reaches a user: every integer argument of every compiled entry, found from
the compiled signatures (not a list), out of range gives a ValueError naming the call, the
argument, the value, the valid range and the rank (fluxmpi_py/runtime/binding_errors.py,
applied by the rule of the public calls, entry.pass_on). Issue 46's hole."""

import inspect
import re

import pytest
import torch

import fluxmpi_py as fm
from fluxmpi_py._core import C
from fluxmpi_py.runtime.binding_errors import RAW_TEXT, clear_binding_error
from fluxmpi_py.runtime.entry import entry_point


def compiled_entries():
    """(label, callable) of every function of _C and every method of its classes."""
    for name, obj in vars(C).items():
        if name.startswith("__"):
            continue
        if isinstance(obj, type):
            for m, attr in vars(obj).items():
                if (m == "__init__" or not m.startswith("_")) and callable(attr):
                    yield f"{name}.{m}", getattr(obj, m) if m != "__init__" else obj
        elif callable(obj):
            yield name, obj


def integer_parameters():
    """(label, callable, parameter) for each integer parameter in a compiled signature."""
    out = []
    for label, fn in compiled_entries():
        doc = fn.__doc__ or "" if not isinstance(fn, type) else fn.__init__.__doc__ or ""
        for sig in re.findall(r"^(?:\d+\. )?\w*\((.*)\) -> ", doc, re.M):
            for name in re.findall(r"(\w+): [^,=]*SupportsInt", sig):
                if (label, name) not in {(x, n) for x, _, n in out}:
                    out.append((label, fn, name))
    return out


PARAMS = integer_parameters()


def test_the_walk_finds_the_compiled_integers():
    labels = {(label, name) for label, _, name in PARAMS}
    assert ("bcast_", "root_rank") in labels and ("shard_range", "world_size") in labels
    assert ("GradientReducer.mark_ready", "index") in labels
    assert len(PARAMS) > 40, len(PARAMS)


@pytest.mark.parametrize("value", [2**64, -(2**63) - 1])
@pytest.mark.parametrize("label, fn, name", PARAMS, ids=[f"{x}-{n}" for x, _, n in PARAMS])
def test_an_integer_out_of_range_is_named_not_the_binding(label, fn, name, value):
    fm.Init()
    with pytest.raises(TypeError) as raw:  # fits no C++ integer: refused before it runs
        fn(**{name: value})
    assert re.search("incompatible (function|constructor) arguments", str(raw.value))
    clear = clear_binding_error(raw.value)
    assert isinstance(clear, ValueError), clear
    text = str(clear)
    assert f"{name}={value} is out of range on rank {fm.local_rank()}" in text, text
    assert "-2**63 <= " in text and RAW_TEXT not in text, text


def test_a_public_call_gives_the_clear_text():
    # Through the rule of the public calls: whichever call reaches the binding with it.
    fm.Init()

    @entry_point("f()")
    def f(n):
        return C.shard_range(n, 1, 0, "even")

    assert f(3) == (0, 3)
    with pytest.raises(ValueError, match=r"shard_range\(\): n=18446744073709551616 is out of") as e:
        f(2**64)
    assert e.value.__suppress_context__
    with pytest.raises(TypeError, match=r"shard_range\(\): n must be an int, got 'x' on rank"):
        f("x")


def test_other_errors_pass_unchanged():
    e = RuntimeError("incompatible function arguments")  # not a TypeError: not the binding's
    assert clear_binding_error(e) is e
    assert clear_binding_error(TypeError("other")).args == ("other",)
    assert inspect.isfunction(clear_binding_error)
    assert torch.is_tensor(torch.ones(1))
