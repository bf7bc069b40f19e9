"""The compiled calls' own argument errors, in words: where pybind11 cannot convert an argument
(an integer beyond the C++ type, a value of the wrong type), it raises a TypeError of its own
text ("incompatible function arguments", the compiled signature's overloads and the reprs it
was given). :func:`clear_binding_error` makes of it an exception that names the call, the
argument, its value, the valid range and the rank: a ValueError for an integer out of range,
else a TypeError. The rule of the public calls (:mod:`.entry`) applies it to every error it
passes on, so it holds for every integer argument of every compiled entry, with no cost to a
call that succeeds.

>>> e = TypeError("f(): incompatible function arguments. The following argument types are "
...     "supported:\\n    1. (n: typing.SupportsInt | typing.SupportsIndex) -> None\\n\\n"
...     "Invoked with: 9223372036854775808")
>>> print(clear_binding_error(e))  # doctest: +ELLIPSIS
f(): n=9223372036854775808 is out of range...: expected -2**63 <= n < 2**63 (a 64-bit integer)
"""

from __future__ import annotations

import re

from .._core import C

__all__ = ["clear_binding_error", "RAW_TEXT"]

#: pybind11's words when no overload of a compiled call (or constructor) takes the arguments.
RAW_TEXT = "incompatible function arguments"
_RAW = re.compile(r"incompatible (function|constructor) arguments")
_INT = "SupportsInt"
_OPEN, _CLOSE = "([{<", ")]}>"


def _split(text: str) -> list[str]:
    """``text`` cut at its top-level commas (not inside brackets or quotes), stripped."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote and text[i - 1] != "\\" else quote
        elif ch in "'\"":
            quote = ch
        elif ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return [p for p in parts if p]


def _parse(text: str):
    """(call, [(parameter, type)] of the first overload, [positional reprs], {name: repr})."""
    call = text.split("(", 1)[0]
    sig = re.search(r"^\s+1\. [\w.]*\((.*)\)(?: -> |$)", text, re.M)
    got = text.split("Invoked with:", 1)[1].strip()
    params = []
    for p in _split(sig.group(1)) if sig else []:
        name, _, kind = p.partition(":")
        params.append((name.strip(), kind.split("=", 1)[0].strip()))
    positional, _, named = got.partition("kwargs:")
    named_values = dict(_split(kw)[0].split("=", 1) for kw in _split(named) if "=" in kw)
    return call, params, _split(positional.rstrip("; ")), named_values


def _rank() -> str:
    return f" on rank {C.rank()}" if C.initialized() else ""


def _range(name: str, value: int) -> str:
    """The valid range that ``value`` most likely left (the signature does not say the C++
    type: 64 bits, 32, or unsigned)."""
    if not -(1 << 63) <= value < 1 << 63:
        return f"-2**63 <= {name} < 2**63 (a 64-bit integer)"
    if value < 0:
        return f"0 <= {name} (a count or size: no negative value)"
    return f"-2**31 <= {name} < 2**31 (a 32-bit integer)"


def clear_binding_error(error: BaseException) -> BaseException:
    """``error`` itself, unless it is pybind11's TypeError for arguments that a compiled call
    cannot convert: then a ValueError naming the call, an integer argument out of range, its
    value, the valid range and this rank, or a TypeError naming the argument of the wrong
    type (or, where the text does not tell, the call and its signature).

    >>> clear_binding_error(KeyError("k"))
    KeyError('k')
    """
    text = str(error)
    if not isinstance(error, TypeError) or not _RAW.search(text):
        return error
    try:
        call, params, positional, named = _parse(text)
    except (IndexError, ValueError):
        return error  # a text of another shape: as it is
    given = dict(zip((n for n, _ in params), positional))  # a method's self: its repr
    given.update(named)
    ints = [(n, given[n]) for n, kind in params if _INT in kind and n in given]
    numbers = [(n, int(v)) for n, v in ints if re.fullmatch(r"-?\d+", v)]
    # The likeliest culprit first: beyond 64 bits, not an int at all, then beyond 32 bits or
    # negative (a C++ int or an unsigned count; the signature does not say which).
    beyond = [(n, v) for n, v in numbers if not -(1 << 63) <= v < 1 << 63]
    wrong = [(n, v) for n, v in ints if not re.fullmatch(r"-?\d+", v)]
    odd = [(n, v) for n, v in numbers if v < 0 or v >= 1 << 31]
    if beyond or (odd and not wrong):
        name, value = (beyond or odd)[0]
        clear: Exception = ValueError(
            f"{call}(): {name}={value} is out of range{_rank()}: expected {_range(name, value)}"
        )
    elif wrong:
        clear = TypeError(f"{call}(): {wrong[0][0]} must be an int, got {wrong[0][1]}{_rank()}")
    else:
        shown = ", ".join(f"{n}: {k}" for n, k in params)
        got = ", ".join(positional + [f"{k}={v}" for k, v in named.items()])
        clear = TypeError(f"{call}(): its arguments do not fit ({shown}){_rank()}; got {got}")
    clear.__suppress_context__ = True  # the raw text is what the user should not have to read
    return clear
