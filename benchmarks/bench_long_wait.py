"""A rank that waits long for a late one: its CPU meanwhile, and how soon it returns once the
late rank arrives, with the backoff to sleeping (FLUXMPI_WAIT_BACKOFF) on, at several naps,
and off, in both import orders.

    python benchmarks/bench_long_wait.py [--late 1.5] [--reps 3] [--pairs 2]   # a driver
    mpiexec -n 2 python benchmarks/bench_long_wait.py   # one launch, this environment's setting

The driver launches 2 ranks per setting and import order, alternating settings `--pairs`
times, so that a change in machine load hits all alike. In each launch, per size (16 floats:
MPI_Allreduce; 4 Mi floats, 16 MiB: the ring), rank 1 sleeps `--late` seconds before an
allreduce that rank 0 enters at once; rank 0 reports its process's CPU over the wait
(all threads), the share of the wait its threads were running or waiting for a core (Linux's
schedstat: on a busy machine a yielding wait gets little CPU yet wants it all along), the
time from rank 1 entering to rank 0 returning ("after_ms"), and the
same allreduce with neither rank late ("prompt_ms"). Medians over repetitions and launches.
Prints one JSON line and writes benchmarks/results/bench_long_wait.json.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SETTINGS = ["off", "100:0.25", "100:1", "100:4", "100:10"]
SIZES = {"16 floats": 16, "16 MiB": 4 << 20}

if "--mpi4py-first" in sys.argv:
    from mpi4py import MPI  # noqa: F401  (starts MPI before fluxmpi_py is imported)


def runnable_s():
    """Seconds this process's threads have been on a core or waiting in a run queue."""
    total = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                total += sum(int(v) for v in f.read().split()[:2])
        except FileNotFoundError:
            continue
    return total / 1e9


def worker(args):
    import torch

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import fluxmpi_py as fm

    torch.set_num_threads(1)
    fm.Init()
    rank = fm.local_rank()
    out = {"mpi_wait": fm.build_info()["mpi_wait"], "sizes": {}}
    for label, n in SIZES.items():
        x = torch.ones(n)
        fm.allreduce_(x)  # warm: buffers, the ring's plan
        prompt, share, ready, after = [], [], [], []
        for _ in range(args.reps):
            fm.barrier()
            t0 = time.monotonic()
            fm.allreduce_(x)
            prompt.append(time.monotonic() - t0)
            fm.barrier()
            if rank == 1:
                time.sleep(args.late)
            entered = time.monotonic()  # CLOCK_MONOTONIC: one clock for the host's processes
            wall, cpu, run = time.monotonic(), time.process_time(), runnable_s()
            fm.allreduce_(x)
            done = time.monotonic()
            wall, cpu, run = done - wall, time.process_time() - cpu, runnable_s() - run
            late = torch.tensor([entered if rank == 1 else 0.0], dtype=torch.float64)
            fm.allreduce_(late)  # rank 1's entry, to rank 0
            if rank == 0:
                share.append(cpu / wall)
                ready.append(run / wall)
                after.append(done - late.item())
        out["sizes"][label] = {
            "waiter_cpu_share": round(statistics.median(share), 3) if share else None,
            "waiter_runnable_share": round(statistics.median(ready), 3) if ready else None,
            "after_ms": round(1000 * statistics.median(after), 2) if after else None,
            "prompt_ms": round(1000 * statistics.median(prompt), 2),
        }
    if rank == 0:
        print(json.dumps(out), flush=True)


def driver(args):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from common import emit

    runs = {}
    for _ in range(args.pairs):
        for order in ("fluxmpi_py_first", "mpi4py_first"):
            for setting in args.settings.split(","):
                env = dict(os.environ, FLUXMPI_WAIT_BACKOFF=setting, OMP_NUM_THREADS="1")
                cmd = ["mpiexec", "-n", "2", "--oversubscribe", sys.executable, __file__]
                cmd += ["--worker", "--late", str(args.late), "--reps", str(args.reps)]
                cmd += ["--mpi4py-first"] if order == "mpi4py_first" else []
                p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
                if p.returncode != 0:
                    sys.exit(
                        f"{order} {setting}: exit {p.returncode}\n{(p.stdout + p.stderr)[-4000:]}"
                    )
                record = json.loads(p.stdout.strip().splitlines()[-1])
                runs.setdefault((order, setting), []).append(record)
    result = {"bench": "long_wait", "late_s": args.late, "reps": args.reps, "launches": args.pairs}
    for (order, setting), recs in runs.items():
        row = {"mpi_wait": recs[0]["mpi_wait"]}
        for label in SIZES:
            vals = [r["sizes"][label] for r in recs]
            row[label] = {k: round(statistics.median(v[k] for v in vals), 3) for k in vals[0]}
        result.setdefault(order, {})[setting] = row
    emit("bench_long_wait", result, 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--worker", action="store_true", help="(under mpiexec: one launch)")
    ap.add_argument("--mpi4py-first", action="store_true", help="start MPI before fluxmpi_py")
    ap.add_argument("--late", type=float, default=1.5, help="seconds the late rank sleeps")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--pairs", type=int, default=2, help="launches per setting and order")
    ap.add_argument("--settings", default=",".join(SETTINGS), help="FLUXMPI_WAIT_BACKOFF values")
    args = ap.parse_args()
    under_mpiexec = "OMPI_COMM_WORLD_SIZE" in os.environ or "PMI_RANK" in os.environ
    return worker(args) if args.worker or under_mpiexec else driver(args)


if __name__ == "__main__":
    main()
