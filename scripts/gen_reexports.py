#!/usr/bin/env python3
"""Write the re-export blocks of fluxmpi_py's subpackage __init__ files and of the package's
own __init__ from each public module's ``__all__`` (run after adding a public name; the tests
check that the package exports exactly the union of the modules' ``__all__``).

    python3 scripts/gen_reexports.py
"""

from __future__ import annotations

import ast
import os

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fluxmpi_py")
# The public modules of each layer, in the order their names are listed.
LAYOUT = {
    "runtime": ["world", "stop", "elastic", "groups", "printing", "preferences", "launch", "logs"],
    "collectives": ["inplace", "differentiable", "rows", "objects"],
    "training": [
        "optimizer",
        "gradients",
        "buffers",
        "checkpoint",
        "checkpoint_dir",
        "consistency",
        "sync_batchnorm",
        "join",
        "exact_sum",
        "record",
        "elastic_step",
    ],
    "sync": ["synchronize"],
    "data": ["container", "sampler"],
}
MARK = "# --- re-exports (scripts/gen_reexports.py) ---"


def all_of(path: str) -> list[str]:
    tree = ast.parse(open(path, encoding="utf-8").read())
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            return [e.value for e in node.value.elts]  # type: ignore[attr-defined]
    return []


def block(imports: list[tuple[str, list[str]]]) -> str:
    lines = []
    for mod, names in imports:
        if names:
            lines.append(f"from {mod} import (")
            lines += [f"    {n}," for n in names]
            lines.append(")")
    every = [n for _, names in imports for n in names]
    lines += ["", "__all__ = ["] + [f'    "{n}",' for n in every] + ["]", ""]
    return "\n".join(lines)


def rewrite(path: str, text: str) -> None:
    old = open(path, encoding="utf-8").read()
    head = (
        old.split(MARK)[0].rstrip() + "\n\n"
        if MARK in old
        else old.split("\nfrom ")[0].rstrip() + "\n\n"
    )
    with open(path, "w", encoding="utf-8") as f:
        f.write(head + MARK + "\n" + text)


def main() -> None:
    top = []
    for pkg, mods in LAYOUT.items():
        imports = [(f".{m}", all_of(os.path.join(ROOT, pkg, m + ".py"))) for m in mods]
        rewrite(os.path.join(ROOT, pkg, "__init__.py"), block(imports))
        top.append((f".{pkg}", [n for _, names in imports for n in names]))
    text = block(top).replace(
        "\n__all__",
        '\nfrom .integrations import c10d as _c10d  # noqa: F401  (registers "fluxmpi")\n\n__all__',
        1,
    )
    rewrite(os.path.join(ROOT, "__init__.py"), text)


if __name__ == "__main__":
    main()
