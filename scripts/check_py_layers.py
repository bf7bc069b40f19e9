#!/usr/bin/env python3
"""Check that the Python package keeps its layers, as scripts/check_layers.py does for csrc/:
every import of a fluxmpi_py module points to the importing module's own layer or a lower one,
no two modules import each other (directly or around a cycle), no fluxmpi_py import hides
inside a function, and only ``_core`` imports the compiled ``_C``.

    python3 scripts/check_py_layers.py [PACKAGE_DIR]   # exit status 1 and one line per fault

The layers, top to bottom (docs/DEVELOPING.md):

    fluxmpi_py/__init__.py, horovod.py,   the public face (fm.X, fluxmpi_py.horovod) and the
    run.py, flight.py                     launcher (python -m fluxmpi_py.run), the flight
                                          recorder's reader (python -m fluxmpi_py.flight)
    integrations/                         the c10d backend and the Horovod face
    training/                             optimizer, gradients, join, buffers, checkpoints, ...
    sync/  data/                          synchronize_ | DistributedDataContainer, sampler
    collectives/                          allreduce_ ... alltoall, objects, differentiable
    runtime/                              Init and the world, groups, agreement, stalls, launch
    _core.py  _util/                      the gateway to _C | helpers that need nothing else

sync/ and data/ share a level but may not import each other. integrations/ may also import the
package itself (``import fluxmpi_py as fm``: the public names), which must then not import them
back: the cycle check sees that. integrations/ build on the public API only, as a third party
would: they may not import ``_core``, nor an underscore-named module or name of another layer
(their own private modules, such as ``integrations/horovod/_handles.py``, are theirs).

The suite, tests/, is checked the same way (``--tests DIR`` alone): its modules import each other
by top-level name (``import mpi_util``) from three layers, top to bottom: the test files
(``test_*.py``, ``conftest.py``), the helpers they share (the other ``tests/*.py``), and apart
from both the workers (``tests/workers/``, run as scripts under mpiexec: they import each other
and harness.py, and nothing of tests/ imports them). No circle, and no import of a tests module
inside a function.

    python3 scripts/check_py_layers.py                 # fluxmpi_py/ and tests/
    python3 scripts/check_py_layers.py --tests TESTS_DIR

>>> test_layer_of("test_data.py"), test_layer_of("mpi_util.py"), test_layer_of("workers/x.py")
('tests', 'helpers', 'workers')

>>> layer_of("training/join.py"), layer_of("_core.py"), layer_of("__init__.py")
('training', '_core', 'face')
>>> allowed("training", "runtime"), allowed("runtime", "collectives"), allowed("sync", "data")
(True, False, False)
"""

from __future__ import annotations

import ast
import os
import sys

# top-level name -> (layer, level); a module may import its own layer or one of a lower level.
LAYERS = {
    "__init__.py": ("face", 7),
    "horovod.py": ("face", 7),
    "run.py": ("face", 7),  # python -m fluxmpi_py.run
    "reproduce.py": ("face", 7),  # python -m fluxmpi_py.reproduce
    "flight.py": ("face", 7),  # python -m fluxmpi_py.flight
    "integrations": ("integrations", 6),
    "training": ("training", 5),
    "sync": ("sync", 4),
    "data": ("data", 4),
    "collectives": ("collectives", 3),
    "runtime": ("runtime", 2),
    "_core.py": ("_core", 1),
    "_util": ("_util", 0),
}
PACKAGE = "fluxmpi_py"
GATEWAY = "_core.py"  # the one module that may import _C
_PUBLIC_ONLY = (
    "integrations build on the public API (fm.X, or a public module's public names); add a "
    "public, documented function to the layer below instead"
)


def layer_of(rel: str) -> str | None:
    """The layer of a path relative to the package directory (None outside every layer)."""
    top = rel.split("/", 1)[0]
    return LAYERS[top][0] if top in LAYERS else None


def allowed(src: str, dst: str) -> bool:
    """Whether a module of layer `src` may import a module of layer `dst`."""
    level = {name: lvl for name, lvl in LAYERS.values()}
    return src == dst or level[dst] < level[src]


def modules(root: str) -> dict[str, str]:
    """Dotted module name (relative to the package, "" for the package) -> path relative to root."""
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/")
                name = rel[: -len(".py")].replace("/", ".")
                name = name[: -len("__init__")].rstrip(".") if name.endswith("__init__") else name
                out[name] = rel
    return out


def _from_base(cur: str, is_pkg: bool, node: ast.ImportFrom) -> str | None:
    """The package module (dotted, relative to the package) a ``from X import ...`` reads
    from; None outside the package."""
    if node.level == 0:
        if node.module != PACKAGE and not (node.module or "").startswith(PACKAGE + "."):
            return None
        return (node.module or "")[len(PACKAGE) + 1 :]
    parts = cur.split(".") if cur else []
    pkg = parts if is_pkg else parts[:-1]
    pkg = pkg[: len(pkg) - (node.level - 1)] if node.level > 1 else pkg
    return ".".join([*pkg, *([node.module] if node.module else [])])


def _target(mods: dict[str, str], cur: str, is_pkg: bool, node: ast.AST) -> list[str]:
    """The package modules an import statement reaches (a ``from X import name`` may name a
    submodule of X)."""
    found = []
    if isinstance(node, ast.Import):
        for a in node.names:
            if a.name == PACKAGE or a.name.startswith(PACKAGE + "."):
                found.append(a.name[len(PACKAGE) + 1 :])
        return found
    assert isinstance(node, ast.ImportFrom)
    base = _from_base(cur, is_pkg, node)
    if base is None:
        return []
    for a in node.names:
        sub = f"{base}.{a.name}" if base else a.name
        found.append(sub if sub in mods or a.name == "_C" else base)
    return found


def _private_reach(mods: dict[str, str], cur: str, is_pkg: bool, node: ast.AST) -> list[str]:
    """What an import of an ``integrations/`` module reaches that is not the public API of the
    layers below: ``_core`` (the compiled core), an underscore-named module, or an
    underscore-named name, of another layer (the integration's own private modules are its
    business). Each as the dotted name imported."""
    reached: list[tuple[str, str | None]] = []  # (module, name imported from it or None)
    if isinstance(node, ast.Import):
        reached = [(t, None) for t in _target(mods, cur, is_pkg, node)]
    elif isinstance(node, ast.ImportFrom):
        base = _from_base(cur, is_pkg, node)
        if base is None:
            return []
        for a in node.names:
            sub = f"{base}.{a.name}" if base else a.name
            reached.append((sub, None) if sub in mods else (base, a.name))
    found = []
    for module, name in reached:
        if module in mods and layer_of(mods[module]) == "integrations":
            continue
        parts = [p for p in module.split(".") if p] + ([name] if name else [])
        if any(p.startswith("_") and p != "__init__" for p in parts):
            found.append(".".join([PACKAGE, *parts]))
    return found


def _private_attributes(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, ``fluxmpi_py._name``) of each underscore-named attribute read through the
    package itself (``import fluxmpi_py as fm; fm._core``): the private side, reached around
    the import check."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.asname or a.name for a in node.names if a.name == PACKAGE}
    return [
        (n.lineno, f"{PACKAGE}.{n.attr}")
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute)
        and isinstance(n.value, ast.Name)
        and n.value.id in names
        and n.attr.startswith("_")
        and not (n.attr.startswith("__") and n.attr.endswith("__"))
    ]


def _functions_imports(tree: ast.AST) -> set[int]:
    """Ids of the import nodes that sit inside a function or method."""
    inner: set[int] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for n in ast.walk(fn):
                if isinstance(n, (ast.Import, ast.ImportFrom)):
                    inner.add(id(n))
    return inner


def check(root: str) -> tuple[list[str], int]:
    """(faults, number of modules checked) for the package at `root` (a fluxmpi_py/ directory)."""
    faults: list[str] = []
    mods = modules(root)
    edges: dict[str, set[str]] = {}
    for name, rel in sorted(mods.items()):
        src = layer_of(rel)
        if src is None:
            faults.append(f"{rel}: outside every layer (put it in one of the layers' folders)")
            continue
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            tree = ast.parse(f.read(), rel)
        inner = _functions_imports(tree)
        is_pkg = rel.endswith("__init__.py")
        if src == "integrations":
            for line, private in _private_attributes(tree):
                faults.append(f"{rel}:{line}: reads {private}: {_PUBLIC_ONLY}")
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            if src == "integrations":
                for private in _private_reach(mods, name, is_pkg, node):
                    faults.append(f"{rel}:{node.lineno}: imports {private}: {_PUBLIC_ONLY}")
            for target in _target(mods, name, is_pkg, node):
                where = f"{rel}:{node.lineno}"
                if target.endswith("_C") and target.split(".")[-1] == "_C" or target == "_C":
                    if rel != GATEWAY:
                        faults.append(f"{where}: imports _C; only {GATEWAY} may (use its C)")
                    continue
                if id(node) in inner:
                    faults.append(
                        f"{where}: imports {PACKAGE}.{target} inside a function; import it at "
                        "the top of the module (a circle it dodges is a fault of its own)"
                    )
                if target not in mods:
                    continue  # a name from the package itself: checked by the edge to it
                dst = layer_of(mods[target])
                if src == "integrations" and target == "":
                    pass  # integrations build on the public face (import fluxmpi_py as fm)
                elif dst is not None and not allowed(src, dst):
                    faults.append(
                        f"{where}: imports {PACKAGE}.{target or '(the package)'}: layer {src} "
                        f"may not import layer {dst}"
                    )
                if target != name:
                    edges.setdefault(name, set()).add(target)
    for cycle in _find_cycles(edges):
        faults.append("import cycle: " + " -> ".join(f"{PACKAGE}.{m}".rstrip(".") for m in cycle))
    return faults, len(mods)


def _find_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The cycles a depth-first walk closes (one per edge back onto its path), each with its
    first node repeated at the end."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []
    found: list[list[str]] = []

    def visit(n: str) -> None:
        state[n] = 1
        path.append(n)
        for m in sorted(edges.get(n, ())):
            if state.get(m) == 1:
                found.append(path[path.index(m) :] + [m])
            elif m not in state:
                visit(m)
        path.pop()
        state[n] = 2

    for n in sorted(edges):
        if n not in state:
            visit(n)
    return found


# --- tests/ ---------------------------------------------------------------------------------
# layer -> the layers it may import (its own included)
TEST_LAYERS = {
    "tests": ("tests", "helpers"),
    "helpers": ("helpers",),
    "workers": ("workers",),
    "typecheck": (),
}


def test_layer_of(rel: str) -> str:
    """The layer of a path relative to tests/."""
    if "/" in rel:
        return rel.split("/", 1)[0]
    name = rel.rsplit("/", 1)[-1]
    return "tests" if name.startswith("test_") or name == "conftest.py" else "helpers"


def check_tests(root: str) -> tuple[list[str], int]:
    """(faults, number of modules checked) for the suite at `root` (a tests/ directory). A
    module finds another by top-level name in its own folder, then in tests/ itself (each adds
    its own folder, or tests/, to sys.path)."""
    faults: list[str] = []
    rels = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        rels += [
            os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/")
            for f in sorted(files)
            if f.endswith(".py")
        ]
    known = set(rels)
    edges: dict[str, set[str]] = {}
    for rel in rels:
        src = test_layer_of(rel)
        if src not in TEST_LAYERS:
            faults.append(f"tests/{rel}: outside every layer of tests/")
            continue
        folder = rel.rsplit("/", 1)[0] + "/" if "/" in rel else ""
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            tree = ast.parse(f.read(), rel)
        inner = _functions_imports(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".", 1)[0] + ".py"
                target = folder + top if folder + top in known else top
                if target not in known or target == rel:
                    continue
                where = f"tests/{rel}:{node.lineno}"
                dst = test_layer_of(target)
                if id(node) in inner:
                    faults.append(
                        f"{where}: imports tests/{target} inside a function; import it at the "
                        "top of the module (a circle it dodges is a fault of its own)"
                    )
                if dst not in TEST_LAYERS.get(src, ()):
                    faults.append(f"{where}: imports tests/{target}: {src} may not import {dst}")
                edges.setdefault(rel, set()).add(target)
    for cycle in _find_cycles(edges):
        faults.append("import cycle: " + " -> ".join(f"tests/{m}" for m in cycle))
    return faults, len(rels)


def main(argv: list[str]) -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    status = 0
    if len(argv) == 3 and argv[1] == "--tests":
        runs = [("tests", argv[2])]
    elif len(argv) > 1:
        runs = [("package", argv[1])]
    else:
        runs = [
            ("package", os.path.join(here, "..", PACKAGE)),
            ("tests", os.path.join(here, "..", "tests")),
        ]
    for kind, root in runs:
        faults, n = (check if kind == "package" else check_tests)(root)
        for f in faults:
            print(f)
        if faults:
            print(f"check_py_layers: {len(faults)} fault(s) in {n} modules", file=sys.stderr)
            status = 1
        elif kind == "package":
            print(
                f"check_py_layers: {n} modules follow face > integrations > training > "
                "sync | data > collectives > runtime > _core | _util"
            )
        else:
            print(
                f"check_py_layers: {n} modules of tests/ follow tests > helpers | workers, "
                "no circle"
            )
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
