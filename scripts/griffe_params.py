"""Parameter tables for the API reference: every parameter of every public callable
(``fluxmpi_py.__all__`` and ``fluxmpi_py.horovod``'s, and the public methods with a docstring
of their classes) gets a line in its docstring's ``Args:`` section, in the signature's order, for mkdocstrings to render as a table (name, type, default,
description).

A docstring's own ``Args:`` line wins. A parameter it leaves out takes the shared line for its
name below: the parameters that mean the same in every call (``group``, ``name``, ``op``,
``root_rank``, Horovod's ``process_set`` ...), written once. A parameter with neither is a
warning, which ``mkdocs build --strict`` (``make docs``) turns into a failure.
"""

from __future__ import annotations

import logging
import re

import griffe

logger = logging.getLogger("mkdocs.plugins.griffe_params")

# Shared lines: (face, name) first, then name. face is "fm" or "hvd".
SHARED = {
    "name": "a label that enters the ranks' agreement: ranks in calls of different names "
    "raise together, naming both; None: unnamed",
    "group": "a [`Group`][fluxmpi_py.Group] from `new_group`: the call runs among its members "
    "only, and ranks are the group's; None: every rank",
    "tensor": "this rank's tensor (CPU or CUDA)",
    "tensors": "a list of tensors, handled in one call, in the same order on every rank",
    "op": "the reduction, one of the [op names][op-names]",
    "root_rank": "the rank that sends (broadcast, scatter) or receives (reduce, gather)",
    "async_op": "True: start in the background and return a [`Request`][fluxmpi_py.Request] "
    "whose `wait()` returns the result",
    "splits": "the number of rows (along dim 0) for each rank, `total_workers()` of them; "
    "None: equal parts",
    ("hvd", "name"): "Horovod's name of the call; it enters the ranks' agreement, and a name "
    "still held by a call in flight raises",
    ("hvd", "tensor"): "this rank's tensor (CPU or CUDA)",
    ("hvd", "process_set"): "a [`ProcessSet`][fluxmpi_py.horovod.ProcessSet]: the call runs "
    "among its ranks; `global_process_set`: every rank",
    ("hvd", "op"): "`hvd.Sum`, `Average`, `Min`, `Max` or `Product`; None: `average`'s choice, "
    "else `Average`",
    ("hvd", "average"): "Horovod's older switch: True is `op=hvd.Average`, False `hvd.Sum`; "
    "give `op` or `average`, not both",
    ("hvd", "prescale_factor"): "each rank's tensor is multiplied by this before the reduction",
    ("hvd", "postscale_factor"): "the result is multiplied by this after the reduction",
    ("hvd", "compression"): "`hvd.Compression.none`, or `.fp16` (floats travel as float16)",
    ("hvd", "root_rank"): "the rank whose values every rank receives",
    ("hvd", "handle"): "what an `_async` call returned",
}

SECTION = re.compile(r"^(\s*)(Args|Arguments|Parameters):\s*$")
NEXT_SECTION = re.compile(r"^\s*(Returns|Raises|Yields|Examples?|Warns|Notes?|Attributes):\s*$")
ENTRY = re.compile(r"^(\*{0,2}\w+)(?:\s*\([^)]*\))?:\s?(.*)$")


def _methods(cls: griffe.Object):
    """The public methods of ``cls`` that the reference shows (those with a docstring)."""
    for name, member in cls.members.items():
        if not name.startswith("_") and not member.is_alias and member.is_function:
            if member.docstring is not None:
                yield member


def _params(obj: griffe.Object) -> list[str]:
    if obj.is_class:
        init = obj.members.get("__init__")
        if init is None or init.is_alias or not init.is_function:
            return []
        params = list(init.parameters)[1:]
    elif obj.is_function:
        params = list(obj.parameters)
    else:
        return []
    out = []
    for p in params:
        if p.name in ("self", "cls"):
            continue
        prefix = {"var_positional": "*", "var_keyword": "**"}.get(str(p.kind.name), "")
        out.append(prefix + p.name)
    return out


def _split(doc: str) -> tuple[list[str], dict[str, list[str]], list[str], str]:
    """(lines before Args:, {name: its lines}, lines after, indent) of a Google docstring."""
    lines = doc.split("\n")
    start = next((i for i, line in enumerate(lines) if SECTION.match(line)), None)
    if start is None:
        at = next((i for i, line in enumerate(lines) if NEXT_SECTION.match(line)), None)
        if at is None:  # before a top-level doctest, else at the end
            at = next(
                (i for i, line in enumerate(lines) if line.strip().startswith("```pycon")),
                len(lines),
            )
        return lines[:at], {}, lines[at:], ""
    indent = SECTION.match(lines[start]).group(1)
    entries: dict[str, list[str]] = {}
    current = None
    end = start + 1
    while end < len(lines):
        line = lines[end]
        if line.strip() and len(line) - len(line.lstrip()) <= len(indent):
            break
        m = ENTRY.match(line.strip())
        if m and len(line) - len(line.lstrip()) == len(indent) + 4:
            current = m.group(1)
            entries[current] = [m.group(2)]
        elif current is not None and line.strip():
            entries[current].append(line.strip())
        end += 1
    return lines[:start], entries, lines[end:], indent


def fill(obj: griffe.Object, face: str) -> list[str]:
    """Rewrite obj's Args: section to list every parameter; returns the ones with no line."""
    params = _params(obj)
    if not params or obj.docstring is None:
        return params if obj.docstring is None else []
    before, entries, after, indent = _split(obj.docstring.value)
    missing, section = [], [f"{indent}Args:"]
    for p in params:
        bare = p.lstrip("*")
        text = entries.get(p) or entries.get(bare)
        if text is None:
            shared = SHARED.get((face, bare)) or SHARED.get(bare)
            if shared is None:
                missing.append(p)
                continue
            text = [shared]
        section.append(f"{indent}    {p}: {text[0]}")
        section += [f"{indent}        {line}" for line in text[1:]]
    while before and not before[-1].strip():
        before.pop()
    obj.docstring.value = "\n".join([*before, "", *section, "", *after]).rstrip() + "\n"
    return missing


def fill_public(pkg: griffe.Module) -> None:
    seen: set[str] = set()
    faces = [("fm", pkg)]
    if "horovod" in pkg.modules:
        faces.append(("hvd", pkg.modules["horovod"]))
    for face, mod in faces:
        for name in [str(n) for n in mod.exports or []]:
            member = mod.members.get(name)
            if member is None:
                continue
            try:
                obj = member.final_target if member.is_alias else member
            except griffe.AliasResolutionError:
                continue
            if obj.path in seen or not (obj.is_class or obj.is_function):
                continue
            seen.add(obj.path)
            targets = [obj, *(_methods(obj) if obj.is_class else ())]
            for target in targets:
                missing = fill(target, face)
                if missing:
                    logger.warning(
                        "%s: no Args: line for %s in its docstring, and no shared one "
                        "(scripts/griffe_params.py)",
                        target.path,
                        ", ".join(missing),
                    )
