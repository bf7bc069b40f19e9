"""A rank that dies or stops in the middle of CUDA collectives at 2 ranks: the other rank must
end the job, not hang. scripts/gpu_check.sh runs it under a timeout and checks that the job
ended with an error within the stall timeout plus a margin.

    mpiexec -n 2 python scripts/gpu_kill_check.py --mode kill|stop|stall-gpu|nccl-abort
        [--timeout S] [--host-wait]

--mode kill: rank 1 kills itself (SIGKILL) after 20 collectives; the launcher sees it die.
--mode stop: rank 1 sleeps for an hour after 20 collectives, alive but silent; rank 0 waits in
an NCCL call (host wait) or in torch.cuda.synchronize() behind queued calls (no host wait), and
fluxmpi_py's stall timeout (Init(timeout=S)) must end the job.
--mode stall-gpu: rank 1's host goes on, but its GPU stream is held by a sleep of hours queued
before its next collective, so rank 0's NCCL kernel waits on the GPU for a peer that never
comes, and both hosts have already returned from the calls (no host wait): the NCCL watchdog's
stall timeout must end the job. With --host-wait, rank 0 waits on the host inside the call and
the stall report ends it.
--mode nccl-abort: rank 1 aborts its NCCL communicators (ncclCommAbort, a test-only binding)
and sleeps, alive; rank 0's next NCCL call meets NCCL's asynchronous error (the broken
connection) if NCCL reports one (the job then ends with NCCL's message), else the stall
timeout ends it (on an H200 with NCCL 2.28.9's socket transport, NCCL reported nothing in 60 s).
--cpu runs the same on host tensors (over MPI), so that the CPU tests check the script.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import torch

import fluxmpi_py as fm
import fluxmpi_py._C as C


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("kill", "stop", "stall-gpu", "nccl-abort"), required=True)
    ap.add_argument("--timeout", type=float, default=15.0)
    ap.add_argument("--host-wait", action="store_true", help="FLUXMPI_NCCL_HOST_WAIT=1")
    ap.add_argument("--cpu", action="store_true")
    args = ap.parse_args()
    fm.Init(stall_warning=args.timeout / 3, timeout=args.timeout)
    if args.host_wait:
        C.set_nccl_host_wait(True)
    rank = fm.local_rank()
    dev = torch.device("cpu") if args.cpu else torch.device("cuda", torch.cuda.current_device())
    t = torch.ones(1 << 20, device=dev)
    start = time.monotonic()
    for i in range(100000):
        if i == 20 and rank == 1:
            print(f"rank 1: {args.mode} after {i} collectives", flush=True)
            if args.mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if args.mode == "nccl-abort" and dev.type == "cuda":
                torch.cuda.synchronize(dev)
                print(f"rank 1: aborted {C._abort_nccl_comms_for_test()} NCCL communicators",
                      flush=True)  # fmt: skip
            if args.mode in ("stop", "nccl-abort") or dev.type != "cuda":
                time.sleep(3600)
            torch.cuda._sleep(1 << 50)  # hours of spinning on the stream the collectives follow
        fm.allreduce_(t, "max")
        if i % 10 == 0 and dev.type == "cuda":
            torch.cuda.synchronize(dev)
        if time.monotonic() - start > 4 * args.timeout + 60:
            break
    print(f"rank {rank}: FAIL: still running after {time.monotonic() - start:.0f} s", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
