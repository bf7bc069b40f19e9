#!/usr/bin/env python
"""Scaling picture: step time and throughput against the number of ranks, ours and DDP.

Runs examples/resnet_synthetic.py (both modes in each launch) under mpiexec at each rank
count, or re-reads the results of an earlier run (--from-json), and draws two panels with
matplotlib: step time (ms) and throughput (images/s, with the ideal line n x one rank's).
Writes benchmarks/results/scaling.json and scaling.png (scaling.quick.* with --quick) and
prints one JSON line with the throughputs and scaling efficiencies.

    python benchmarks/plot_scaling.py --max-ranks 4              # the full run (minutes)
    python benchmarks/plot_scaling.py --quick --max-ranks 2      # seconds, to check it works
    python benchmarks/plot_scaling.py --from-json benchmarks/results/scaling.json

``--python CMD`` is the ranks' interpreter (shell-quoted; default this one), as in
``python -m fluxmpi_py.reproduce``: a container's python, say.
"""

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "resnet_synthetic.py")
RESULTS = os.path.join(ROOT, "benchmarks", "results")
MODES = {
    "fluxmpi_py": ("fluxmpi_py (DistributedOptimizer, MPI)", "tab:blue", "o"),
    "ddp_gloo": ("torch DDP (gloo)", "tab:orange", "s"),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--max-ranks", type=int, default=4, help="measure at 1..max ranks")
    p.add_argument("--ranks", type=int, nargs="+", help="explicit rank counts instead")
    p.add_argument("--quick", action="store_true", help="tiny model and steps: checks the pipeline")
    p.add_argument("--timeout", type=float, default=1200, help="seconds per launch")
    p.add_argument("--from-json", metavar="PATH", help="plot these results instead of measuring")
    p.add_argument("--out", metavar="PNG", help="default benchmarks/results/scaling[.quick].png")
    p.add_argument("--json-out", metavar="PATH", help="default next to the PNG, .json")
    p.add_argument(
        "--python",
        default="",
        metavar="CMD",
        help="the ranks' interpreter, shell-quoted (default: this one)",
    )
    p.add_argument(
        "extra",
        nargs=argparse.REMAINDER,
        help="after --, arguments for resnet_synthetic.py (e.g. -- --batch-size 64)",
    )
    args = p.parse_args(argv)
    stem = "scaling.quick" if args.quick else "scaling"
    args.out = args.out or os.path.join(RESULTS, stem + ".png")
    args.json_out = args.json_out or os.path.splitext(args.out)[0] + ".json"
    args.ranks = args.ranks or list(range(1, args.max_ranks + 1))
    if min(args.ranks) < 1:
        p.error("rank counts must be >= 1")
    args.extra = [a for a in args.extra if a != "--"]
    args.python = shlex.split(args.python) or [sys.executable]
    return args


def measure(np, quick, extra, timeout, python=(sys.executable,)):
    mpiexec = shutil.which("mpiexec")
    if mpiexec is None:
        sys.exit("plot_scaling: mpiexec is not on PATH (make build installs Open MPI)")
    path = os.environ.get("PYTHONPATH", "")
    env = dict(
        os.environ,
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OMP_NUM_THREADS="1",
        PYTHONPATH=path if ROOT in path.split(os.pathsep) else ROOT + os.pathsep + path,
    )
    cmd = [
        mpiexec,
        "-n",
        str(np),
        "--oversubscribe",
        *python,
        EXAMPLE,
        *(["--quick"] if quick else []),
        *extra,
    ]
    print(f"plot_scaling: {np} rank(s): {' '.join(cmd[4:])}", file=sys.stderr, flush=True)
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        sys.exit(f"plot_scaling: {np} ranks did not finish within {timeout} s:\n{err[-3000:]}")
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        sys.exit(
            f"plot_scaling: {np} ranks failed (exit {proc.returncode}):\n{out[-2000:]}\n{err[-3000:]}"
        )
    return json.loads(lines[-1])


def summarize(runs):
    base = {
        m: runs[0]["results"][m]["images_per_s"] / runs[0]["ranks"]
        for m in MODES
        if m in runs[0]["results"]
    }
    rows = []
    for r in runs:
        row = {"ranks": r["ranks"]}
        for m in base:
            ips = r["results"][m]["images_per_s"]
            row[m] = {
                "step_ms": round(r["results"][m]["step_ms"], 3),
                "images_per_s": round(ips, 2),
                "efficiency": round(ips / (base[m] * r["ranks"]), 4),
            }
        rows.append(row)
    return rows


def plot(runs, path, quick=False):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = [r["ranks"] for r in runs]
    first = runs[0]
    fig, (ax_t, ax_x) = plt.subplots(1, 2, figsize=(11, 4.2))
    for mode, (label, color, marker) in MODES.items():
        if mode not in first["results"]:
            continue
        step = [r["results"][mode]["step_ms"] for r in runs]
        ips = [r["results"][mode]["images_per_s"] for r in runs]
        ax_t.plot(ranks, step, marker=marker, color=color, label=label)
        ax_x.plot(ranks, ips, marker=marker, color=color, label=label)
        if mode == "fluxmpi_py":
            one = ips[0] / ranks[0]
            ax_x.plot(
                ranks, [one * n for n in ranks], "--", color="gray", label="ideal (n x one rank)"
            )
    ax_t.set(
        xlabel="ranks", ylabel="step time (ms)", title="time per training step (lower is better)"
    )
    ax_x.set(xlabel="ranks", ylabel="images / s (all ranks)", title="throughput (higher is better)")
    for ax in (ax_t, ax_x):
        ax.set_xticks(ranks)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax_t.set_ylim(bottom=0)
    ax_x.set_ylim(bottom=0)
    fig.suptitle(
        f"ResNet ({first['parameters']:,} parameters), {first['image_size']}x{first['image_size']} "
        f"synthetic images, batch {first['batch_per_rank']} per rank, "
        f"{first['threads_per_rank']} thread per rank, {os.cpu_count()} cores"
        + ("\nQUICK RUN: sizes too small for the numbers to mean anything" if quick else ""),
        fontsize=10,
    )
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        runs, args.quick = saved["runs"], saved.get("quick", False)
    else:
        runs = [
            measure(n, args.quick, args.extra, args.timeout, args.python)
            for n in sorted(set(args.ranks))
        ]
        os.makedirs(os.path.dirname(os.path.abspath(args.json_out)), exist_ok=True)
        with open(args.json_out, "w") as f:
            json.dump({"benchmark": "scaling", "quick": args.quick, "runs": runs}, f, indent=1)
    plot(runs, args.out, args.quick)
    png = os.path.abspath(args.out)
    print(
        json.dumps(
            {
                "benchmark": "scaling",
                "png": os.path.relpath(png, ROOT) if png.startswith(ROOT + os.sep) else png,
                "quick": args.quick,
                "table": summarize(runs),
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
