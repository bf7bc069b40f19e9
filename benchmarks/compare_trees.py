"""One benchmark on two source trees of fluxmpi_py (before and after a change), launched in
alternation from one driver so that the machine's drift hits both alike, with the ratio of
each number after / before. The trees share nothing but the machine: each is imported from
its own root (PYTHONPATH) with its own compiled _C.

    python benchmarks/compare_trees.py BEFORE_ROOT AFTER_ROOT --pairs 3 -- \\
        benchmarks/bench_train_step.py --quick

Runs ``mpiexec -n 2 python <root>/<bench> ARGS`` (the bench script of each tree) ``--pairs``
times per tree, before/after alternating, and prints one JSON line: for every numeric field of
the benchmark's JSON line, the median over the launches of each tree, and after/before.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys


def launch(root: str, bench: str, args: list[str], np: int, timeout: float) -> dict:
    env = dict(os.environ)
    env.update(
        PYTHONPATH=root,
        OMP_NUM_THREADS="1",
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
    )
    cmd = ["mpiexec", "--oversubscribe", "-n", str(np), sys.executable, os.path.join(root, bench)]
    p = subprocess.run(
        cmd + args, env=env, cwd=root, capture_output=True, text=True, timeout=timeout
    )
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        raise SystemExit(
            f"{root}: {bench} failed (rc {p.returncode}):\n{(p.stdout + p.stderr)[-3000:]}"
        )
    return json.loads(lines[-1])


def numbers(record, prefix="") -> dict[str, float]:
    """Every numeric leaf of a JSON record, by its dotted path."""
    out: dict[str, float] = {}
    if isinstance(record, dict):
        for k, v in record.items():
            out.update(numbers(v, f"{prefix}{k}."))
    elif isinstance(record, (int, float)) and not isinstance(record, bool):
        out[prefix.rstrip(".")] = float(record)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("bench", nargs=argparse.REMAINDER, help="-- BENCH.py [ARGS]")
    a = ap.parse_args()
    bench = [x for x in a.bench if x != "--"]
    runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for _ in range(a.pairs):
        for name, root in (("before", a.before), ("after", a.after)):
            runs[name].append(numbers(launch(root, bench[0], bench[1:], a.np, a.timeout)))
    keys = [k for k in runs["before"][0] if all(k in r for r in runs["before"] + runs["after"])]
    result = {}
    for k in keys:
        b = statistics.median(r[k] for r in runs["before"])
        f = statistics.median(r[k] for r in runs["after"])
        result[k] = {"before": b, "after": f, "after/before": round(f / b, 3) if b else None}
    print(json.dumps({"bench": " ".join(bench), "pairs": a.pairs, "medians": result}))


if __name__ == "__main__":
    main()
