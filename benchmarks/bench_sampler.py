"""One rank's epoch of shuffled indices: fluxmpi_py.DistributedSampler vs torch's.

As rank 0 of 2 ranks, shuffled, at n = 1e6, 1e7 and 1e8, this measures for each sampler
  * first_index_s: from constructing the sampler to holding its first index,
  * epoch_s: from constructing the sampler to the end of a `for i in sampler` loop,
  * extra_peak_bytes: the process's peak resident memory during that, above the RSS just
    before (Linux: the peak is reset through /proc/self/clear_refs, read from VmHWM).
Every measurement runs in a fresh Python process, so peaks and allocator state never mix.
Prints one JSON line (ratios are torch / fluxmpi_py, higher is better for fluxmpi_py) and
writes it to benchmarks/results/bench_sampler.json (bench_sampler.quick.json with --quick).

    python benchmarks/bench_sampler.py            # full run (several minutes, ~5 GB peak)
    python benchmarks/bench_sampler.py --quick    # small sizes, seconds
Under `mpiexec -n 2` only rank 0 measures; the others exit at once so they cannot disturb it.
"""

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORLD, RANK, SEED, EPOCH = 2, 0, 0, 1
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
GOALS = {"n": 10**8, "first_index": 1000.0, "epoch": 4.0, "extra_memory": 100.0}


def _status_kib(key):
    with open("/proc/self/status") as f:
        return int(re.search(rf"^{key}:\s+(\d+) kB", f.read(), re.M).group(1))


def child(impl, n):
    """Measure one sampler epoch in this (fresh) process and print a JSON line."""
    import gc

    import torch

    sys.path.insert(0, ROOT)
    import fluxmpi_py as fm

    def make(size):
        if impl == "fluxmpi_py":
            s = fm.DistributedSampler(
                range(size), num_replicas=WORLD, rank=RANK, shuffle=True, seed=SEED
            )
        else:
            s = torch.utils.data.DistributedSampler(
                range(size), num_replicas=WORLD, rank=RANK, shuffle=True, seed=SEED
            )
        s.set_epoch(EPOCH)
        return s

    list(make(10))  # warm-up: lazy imports and first-call costs are not the sampler's
    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        peak_reset = True
    except OSError:
        peak_reset = False
    base = _status_kib("VmRSS")
    t0 = time.perf_counter()
    sampler = make(n)
    it = iter(sampler)
    first = next(it)
    t_first = time.perf_counter() - t0
    count = 1
    for _ in it:
        count += 1
    t_epoch = time.perf_counter() - t0
    peak = _status_kib("VmHWM")
    assert count == len(sampler) == -(-n // WORLD), (count, len(sampler))
    assert 0 <= first < n
    print(
        json.dumps(
            {
                "first_index_s": t_first,
                "epoch_s": t_epoch,
                "indices": count,
                "extra_peak_bytes": max(0, peak - base) * 1024,
                "peak_reset": peak_reset,
            }
        )
    )


def measure(impl, n, timeout):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", impl, str(n)]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{impl} at n={n} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def best(runs):
    # Times: the fastest run (least disturbed); memory: the largest peak (the honest one).
    return {
        "first_index_s": min(r["first_index_s"] for r in runs),
        "epoch_s": min(r["epoch_s"] for r in runs),
        "extra_peak_bytes": max(r["extra_peak_bytes"] for r in runs),
        "peak_reset": all(r["peak_reset"] for r in runs),
        "runs": len(runs),
    }


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="n = 1e4, 1e5, 1e6 only (validation)")
    ap.add_argument(
        "--sizes",
        type=lambda s: [int(float(x)) for x in s.split(",")],
        help="comma-separated n, e.g. 1e6,1e7",
    )
    ap.add_argument("--repeats", type=int, default=3, help="runs per size below 1e8 (default 3)")
    ap.add_argument("--child", nargs=2, metavar=("IMPL", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]))
        return
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))
    if rank != 0:
        return  # only one rank measures; the others must not compete for the cores
    sizes = args.sizes or ([10**4, 10**5, 10**6] if args.quick else [10**6, 10**7, 10**8])
    results = []
    for n in sizes:
        reps = 1 if n >= 10**8 else max(1, args.repeats)
        timeout = 60 + n * 2e-6 * 20  # torch at 1e8 takes tens of seconds; never hang CI
        runs = {"fluxmpi_py": [], "torch": []}
        for _ in range(reps):  # alternate, so a slow phase of the machine hits both
            for impl in runs:
                runs[impl].append(measure(impl, n, timeout))
        ours, theirs = best(runs["fluxmpi_py"]), best(runs["torch"])
        floor = PAGE  # RSS moves in pages: an extra of 0 counts as one page for the ratio
        results.append(
            {
                "n": n,
                "fluxmpi_py": ours,
                "torch": theirs,
                "ratios": {
                    "first_index": theirs["first_index_s"] / ours["first_index_s"],
                    "epoch": theirs["epoch_s"] / ours["epoch_s"],
                    "extra_memory": max(theirs["extra_peak_bytes"], floor)
                    / max(ours["extra_peak_bytes"], floor),
                },
            }
        )
    at_goal = [r for r in results if r["n"] == GOALS["n"]]
    goals_met = None
    if at_goal:
        ratios = at_goal[0]["ratios"]
        goals_met = all(ratios[k] >= GOALS[k] for k in ("first_index", "epoch", "extra_memory"))
    import torch

    record = {
        "bench": "sampler",
        "setup": f"one rank's epoch as rank {RANK} of {WORLD}, shuffle=True, `for i in sampler` loop",
        "quick": bool(args.quick),
        "results": results,
        "goals": GOALS,
        "goals_met": goals_met,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
        "memory_floor_bytes": PAGE,
    }
    line = json.dumps(record)
    print(line)
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    name = "bench_sampler.quick.json" if args.quick else "bench_sampler.json"
    with open(os.path.join(HERE, "results", name), "w") as f:
        f.write(line + "\n")


if __name__ == "__main__":
    main()
