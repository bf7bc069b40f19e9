"""A griffe extension for the API reference (mkdocs.yml): what `make docs` needs to read
fluxmpi_py's public names and docstrings from the sources, without importing the package.

- ``fluxmpi_py/__init__.py`` may build ``__all__`` in a loop over its submodules (``_MODULES``),
  which static analysis cannot follow. When griffe finds no names there, this adds an alias in
  the package for every name in each listed submodule's ``__all__``, in that order: the same
  names ``import fluxmpi_py`` re-exports at run time.
- A face module that takes its names from another (``from .x import *`` and
  ``from .x import __all__``, as ``fluxmpi_py.horovod`` may do) gets that module's names.
- A name re-exported from a package that also has a submodule of that name (``launch`` from
  ``runtime/launch.py``) is the object, not the submodule.
- Every public callable's parameters are listed in its ``Args:`` section
  (scripts/griffe_params.py), for the reference's parameter tables.
- Docstrings are written for ``help()`` and doctest: ``>>>`` examples become ``pycon`` code
  blocks and Sphinx roles (``:func:`x```) plain code, so that Markdown renders them as meant.
"""

from __future__ import annotations

import ast
import os
import re
import sys

import griffe

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # griffe loads this file by path
from griffe_params import fill_public  # noqa: E402

PACKAGE = "fluxmpi_py"
ROLE = re.compile(r":(?:func|class|meth|attr|mod|data|exc|obj):`~?([^`]+)`")


def _submodule_names(pkg: griffe.Module) -> list[str]:
    """The submodules whose ``__all__`` the package re-exports: ``_MODULES`` when it is a literal,
    else every public submodule but the horovod face (a package of its own)."""
    listed = pkg.members.get("_MODULES")
    if listed is not None and not listed.is_alias and listed.value is not None:
        try:
            return list(ast.literal_eval(str(listed.value)))
        except (ValueError, SyntaxError):
            pass
    return [n for n in pkg.modules if not n.startswith("_") and n != "horovod"]


def _module(pkg: griffe.Module, dotted: str) -> griffe.Module | None:
    mod = pkg
    for part in dotted.split("."):
        mod = mod.modules.get(part)
        if mod is None:
            return None
    return mod


def _add_reexports(pkg: griffe.Module) -> None:
    names: list[str] = []
    for dotted in _submodule_names(pkg):
        mod = _module(pkg, dotted)
        if mod is None or mod.exports is None:
            raise RuntimeError(f"{PACKAGE}.{dotted}: no static __all__ for the API reference")
        for export in mod.exports:
            name = str(export)
            if name in names or name not in mod.members:
                continue
            names.append(name)
            pkg.set_member(name, griffe.Alias(name, mod.members[name], parent=pkg))
    pkg.exports = names


def _borrow_exports(mod: griffe.Module) -> None:
    """``from .x import __all__``: this module's public names are x's, each an alias here."""
    imported = mod.members.get("__all__")
    if imported is None or not imported.is_alias:
        return
    try:
        source = imported.target.parent
    except griffe.AliasResolutionError:
        return
    if source is None or source.exports is None:
        return
    mod.exports = [str(name) for name in source.exports]
    for name in mod.exports:
        if name not in mod.members and name in source.members:
            mod.set_member(name, griffe.Alias(name, source.members[name], parent=mod))


def _objects_over_submodules(mod: griffe.Module) -> None:
    """An exported name that resolves to a module holding an object of the same name (the
    package imported ``launch`` from ``runtime/launch.py``) points at that object."""
    for name in [str(n) for n in mod.exports or []]:
        member = mod.members.get(name)
        try:
            target = member.final_target if member is not None and member.is_alias else member
        except griffe.AliasResolutionError:
            continue
        if target is not None and target.is_module and name in target.members:
            mod.set_member(name, griffe.Alias(name, target.members[name], parent=mod))


def _modules(mod: griffe.Module):
    yield mod
    for sub in mod.modules.values():
        if not sub.is_alias:
            yield from _modules(sub)


def _markdown(text: str) -> str:
    """Doctest lines (and the output below them) as fenced pycon blocks; roles as code."""
    out: list[str] = []
    indent = None  # the example's indentation while in one (an Examples: section's is 4)
    for line in text.split("\n"):
        starts = line.lstrip().startswith(">>>")
        if starts and indent is None:
            indent = line[: len(line) - len(line.lstrip())]
            out += [indent + "```pycon"]
        elif indent is not None and not line.strip():
            out += [indent + "```"]
            indent = None
        out.append(line if indent is not None else ROLE.sub(r"`\1`", line))
    if indent is not None:
        out.append(indent + "```")
    return "\n".join(out)


def _rewrite_docstrings(obj: griffe.Object, seen: set[str]) -> None:
    if obj.path in seen:
        return
    seen.add(obj.path)
    if obj.docstring is not None:
        obj.docstring.value = _markdown(obj.docstring.value)
    for member in obj.members.values():
        if not member.is_alias:
            _rewrite_docstrings(member, seen)


class FluxmpiPublicApi(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs) -> None:
        if pkg.path != PACKAGE:
            return
        _rewrite_docstrings(pkg, set())  # first: a re-export may hide a submodule of its name
        if not pkg.exports:
            _add_reexports(pkg)
        modules = list(_modules(pkg))
        for mod in modules:
            # griffe's own pass can leave `*x.__all__` items unexpanded in a subpackage
            if any(not isinstance(name, str) for name in mod.exports or []):
                loader.expand_exports(mod)
        for mod in modules:
            _borrow_exports(mod)
            _objects_over_submodules(mod)
        fill_public(pkg)  # every parameter a line in its Args: section
