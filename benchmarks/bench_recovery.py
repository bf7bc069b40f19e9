"""The shrink mode's costs (Init(on_failure="shrink"), docs/sections/78-lost-ranks.md), on a
small CNN (BatchNorm, AdamW, 4 micro-batches of 8 samples a rank and step):

    python benchmarks/bench_recovery.py [--steps N]      # a driver: it launches the runs below

1. the mode's cost when nothing fails: 4 ranks, the mode on and off in turns within one launch
   (the agreement before each update, the buffer sync not overlapped), median step times;
2. a loss: 4 ranks, rank 3 SIGKILLed as step N/2 begins; the time from its death to the first
   step the survivors finish after it, and their median step time afterwards;
3. the peer of 2.'s afterwards: a fresh job of 3 ranks, its median step time.

Each launch runs under `mpiexec` with the launcher's `--elastic` switches and a timeout; prints one
JSON line and writes it to results/bench_recovery.json.
"""

import json
import os
import signal
import statistics
import subprocess
import sys
import time

from fluxmpi_py.run import ELASTIC_MPIEXEC_ARGS

HERE = os.path.dirname(os.path.abspath(__file__))
# what `python -m fluxmpi_py.run --elastic` passes (ULFM, no han/cuda collectives, the failure
# detector and its verdicts by reliable broadcast), so that the cost is the users'
FT = ELASTIC_MPIEXEC_ARGS


def worker(mode, steps, out):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    sys.path.insert(0, os.path.dirname(HERE))
    import fluxmpi_py as fm
    from fluxmpi_py._core import C

    torch.set_num_threads(1)
    fm.Init(on_failure="shrink")
    me = fm.local_rank()
    torch.manual_seed(3)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(16 * 14 * 14, 10),
    )
    opt = fm.DistributedOptimizer(
        torch.optim.AdamW(model.parameters(), lr=1e-3), module=model, backward_passes_per_step=4
    )
    x, y = torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))

    def train(step):
        if mode == "loss" and me == 3 and step == steps // 2:
            with open(out + ".killed", "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        for _ in range(4):
            F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()

    times, on = {True: [], False: []}, True
    after, first_after = [], None
    for step in range(steps):
        if mode == "cost":
            on = step % 2 == 0
            C.set_shrink_mode(on)
        fm.barrier()
        t0 = time.perf_counter()
        lost = len(fm.recoveries())
        fm.elastic_step(
            train, step, module=model, optimizer=opt, on_recover=lambda i: opt.rebuild()
        )
        dt = time.perf_counter() - t0
        if len(fm.recoveries()) > lost:
            first_after = time.time()
        elif lost:
            after.append(dt)
        elif step >= 2:
            times[on].append(dt)
    rec = {"rank": me, "world": fm.total_workers(), "first_after": first_after}
    rec["on_ms"] = 1e3 * statistics.median(times[True]) if times[True] else None
    rec["off_ms"] = 1e3 * statistics.median(times[False]) if times[False] else None
    rec["after_ms"] = 1e3 * statistics.median(after) if after else None
    print("RESULT " + json.dumps(rec), flush=True)


def launch(np, mode, steps, out):
    env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1")
    env.update(OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    cmd = [mpiexec, *FT, "-n", str(np), "--oversubscribe", sys.executable, __file__]
    cmd += ["--worker", mode, str(steps), out]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        sys.exit(f"{mode} on {np} ranks failed ({p.returncode}): {(p.stdout + p.stderr)[-3000:]}")
    return [json.loads(line[7:]) for line in p.stdout.splitlines() if line.startswith("RESULT ")]


def main():
    steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 40
    out = os.path.join(HERE, "results", "bench_recovery")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    cost = launch(4, "cost", steps, out)
    loss = launch(4, "loss", steps, out)
    fresh = launch(3, "fresh", steps, out)
    with open(out + ".killed") as f:
        killed = float(f.read())
    on = max(r["on_ms"] for r in cost)
    off = max(r["off_ms"] for r in cost)
    after = max(r["after_ms"] for r in loss)
    fresh3 = max(r["on_ms"] for r in fresh)
    record = {
        "steps": steps,
        "mode_on_ms": round(on, 2),
        "mode_off_ms": round(off, 2),
        "mode_cost": round(on / off, 3),
        "loss_to_first_step_s": round(max(r["first_after"] for r in loss) - killed, 3),
        "after_loss_step_ms_3_ranks": round(after, 2),
        "fresh_3_ranks_step_ms": round(fresh3, 2),
        "after_loss_vs_fresh": round(after / fresh3, 3),
    }
    line = json.dumps(record)
    print(line, flush=True)
    with open(out + ".json", "w") as f:
        f.write(line + "\n")
    os.remove(out + ".killed")


if __name__ == "__main__":
    if "--worker" in sys.argv:
        i = sys.argv.index("--worker")
        worker(sys.argv[i + 1], int(sys.argv[i + 2]), sys.argv[i + 3])
    elif "OMPI_COMM_WORLD_SIZE" in os.environ or "PMIX_RANK" in os.environ:
        # make bench runs every bench_*.py under mpiexec -n 2: this one launches its own jobs
        if os.environ.get("OMPI_COMM_WORLD_RANK", "0") == "0":
            print("bench_recovery.py is a driver: run it as `python benchmarks/bench_recovery.py`")
    else:
        main()
