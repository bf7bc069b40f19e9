#!/usr/bin/env python3
"""Check that csrc/ keeps its layers: every quoted #include points to the including file's own
layer or a lower one, and no two files include each other, directly or around a cycle.

    python3 scripts/check_layers.py [CSRC_DIR]     # exit status 1 and one line per fault

The layers, top to bottom (docs/DEVELOPING.md):

    python/              pybind11 and CPython glue
    c10d/                the torch.distributed backend, over ops/
    ops/                 collectives, agreement, gradient reducer, synchronize_, shards
    fusion/  backend/    pure planners | backends over flat buffers (cuda/ is the NCCL backend)
    runtime/             MPI environment, engine, shutdown hooks, hash

fusion/ and backend/ share a level but may not include each other: planners never see a
backend, backends never see a plan. Includes inside #ifdef count like any other.

>>> layer_of("ops/collectives.cpp"), layer_of("cuda/nccl_comm.h")
('ops', 'backend')
>>> allowed("ops", "runtime"), allowed("runtime", "backend"), allowed("fusion", "backend")
(True, False, False)
"""

from __future__ import annotations

import os
import re
import sys

# directory -> (layer, level); a file may include its own layer or any layer of a lower level.
LAYERS = {
    "python": ("python", 5),
    "c10d": ("c10d", 4),
    "ops": ("ops", 3),
    "fusion": ("fusion", 2),
    "backend": ("backend", 2),
    "cuda": ("backend", 2),
    "runtime": ("runtime", 1),
}
SOURCES = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def layer_of(rel: str) -> str | None:
    """The layer of a path relative to csrc/ (None outside every layer)."""
    top = rel.split("/", 1)[0]
    return LAYERS[top][0] if "/" in rel and top in LAYERS else None


def allowed(src: str, dst: str) -> bool:
    """Whether a file of layer `src` may include a file of layer `dst`."""
    level = {name: lvl for name, lvl in LAYERS.values()}
    return src == dst or level[dst] < level[src]


def sources(root: str) -> list[str]:
    out = []
    for d, _, files in os.walk(root):
        out += [
            os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/")
            for f in files
            if f.endswith(SOURCES)
        ]
    return sorted(out)


def resolve(root: str, rel: str, inc: str) -> str | None:
    """A quoted include as a path relative to csrc/: from csrc/, else from the file's folder."""
    for base in ("", os.path.dirname(rel)):
        cand = os.path.normpath(os.path.join(base, inc)).replace(os.sep, "/")
        if os.path.isfile(os.path.join(root, cand)):
            return cand
    return None


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph, as a list of nodes with the first repeated at the end."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        path.append(n)
        for m in sorted(edges.get(n, ())):
            if state.get(m) == 1:
                return path[path.index(m) :] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        path.pop()
        state[n] = 2
        return None

    for n in sorted(edges):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def check(root: str) -> tuple[list[str], int]:
    """(faults, number of files checked) for the tree at `root` (a csrc/ directory)."""
    faults = []
    files = sources(root)
    # A unit is a header with its implementation (ops/shard.h + ops/shard.cpp).
    edges: dict[str, set[str]] = {}
    for rel in files:
        src = layer_of(rel)
        if src is None:
            faults.append(f"{rel}: outside every layer (put it in one of {', '.join(LAYERS)}/)")
            continue
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            text = f.read()
        for m in INCLUDE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            target = resolve(root, rel, m.group(1))
            if target is None:
                faults.append(f'{rel}:{line}: includes "{m.group(1)}", which is not in csrc/')
                continue
            dst = layer_of(target)
            if dst is None:
                continue  # reported as a file outside every layer
            if not allowed(src, dst):
                faults.append(
                    f'{rel}:{line}: includes "{m.group(1)}": layer {src} may not '
                    f"include layer {dst}"
                )
            unit, dst_unit = os.path.splitext(rel)[0], os.path.splitext(target)[0]
            if unit != dst_unit:
                edges.setdefault(unit, set()).add(dst_unit)
    cycle = find_cycle(edges)
    if cycle:
        faults.append("include cycle: " + " -> ".join(cycle))
    return faults, len(files)


def main(argv: list[str]) -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    root = argv[1] if len(argv) > 1 else os.path.join(here, "..", "csrc")
    faults, n = check(root)
    for f in faults:
        print(f)
    if faults:
        print(f"check_layers: {len(faults)} fault(s) in {n} files", file=sys.stderr)
        return 1
    print(f"check_layers: {n} files follow python > ops > fusion | backend > runtime")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
