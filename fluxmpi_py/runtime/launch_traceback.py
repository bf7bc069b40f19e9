"""A failed rank's traceback, as launch() shows it: the frames of the function that was sent,
named by the caller's file or notebook cell and line, with the source line.

A function sent by value (cloudpickle: one defined in a notebook cell or a script's
``__main__``) runs on the ranks under the file name ``<dynamic-code>``, so the rank's
traceback can neither name the cell nor quote its lines. The caller's process still has them:
``where`` collects, before the launch, the file name of every code object that travels with
the function (its own, nested ones, and those of the ``__main__`` functions it uses), by name;
``rewrite`` puts them back into the traceback text, as IPython names a cell (``Cell In[3]``),
with the line from ``linecache``.

>>> def f():
...     raise ValueError("x")
>>> text = 'Traceback (most recent call last):\\n  File "<dynamic-code>", line 2, in f\\nValueError: x\\n'
>>> print(rewrite(text, {"f": f.__code__.co_filename}).splitlines()[1])  # doctest: +ELLIPSIS
  File "<doctest ...>", line 2, in f
"""

from __future__ import annotations

import linecache
import re
import sys
import types
from typing import Callable

__all__: list[str] = []

DYNAMIC = "<dynamic-code>"
_FRAME = re.compile(r'^  File "<dynamic-code>", line (\d+), in (.+)$')


def _codes(code: types.CodeType):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def where(fn: Callable) -> dict[str, str]:
    """{code name: file name} of fn's code and of what travels with it by value: nested
    functions, and the functions of ``__main__`` that it names (recursively)."""
    found: dict[str, str] = {}
    seen: set[int] = set()
    todo = [fn]
    while todo:
        f = todo.pop()
        code = getattr(f, "__code__", None)
        if code is None or id(code) in seen:
            continue
        seen.add(id(code))
        for c in _codes(code):
            found.setdefault(c.co_name, c.co_filename)
            found.setdefault(c.co_qualname, c.co_filename)
            for name in c.co_names:
                g = getattr(f, "__globals__", {}).get(name)
                if isinstance(g, types.FunctionType) and g.__module__ == "__main__":
                    todo.append(g)
    return found


def _cell_name(filename: str) -> str | None:
    """IPython's name for a cell's file (``Cell In[3]``), when this process is a kernel."""
    ipython = sys.modules.get("IPython")
    shell = getattr(ipython, "get_ipython", lambda: None)() if ipython else None
    names = getattr(getattr(shell, "compile", None), "_filename_map", None)
    if isinstance(names, dict) and filename in names:
        return f"Cell In[{names[filename]}]"
    return None


def rewrite(text: str, files: dict[str, str]) -> str:
    """The traceback ``text`` with its ``<dynamic-code>`` frames named by ``files``."""
    out: list[str] = []
    for line in text.splitlines():
        m = _FRAME.match(line)
        filename = files.get(m.group(2)) if m else None
        if m is None or filename is None:
            out.append(line)
            continue
        lineno, name = int(m.group(1)), m.group(2)
        cell = _cell_name(filename)
        out.append(
            f"  {cell}, line {lineno}, in {name}"
            if cell
            else f'  File "{filename}", line {lineno}, in {name}'
        )
        source = linecache.getline(filename, lineno).strip()
        if source:
            out.append(f"    {source}")
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")
