"""How a job ends when one rank fails or leaves early. Usage: failure_worker.py MODE.

The last rank ("the leaver") misbehaves; every other rank waits for it in a collective.
    raise        the leaver raises an uncaught exception
    raise_c10d   the same after torch.distributed.init_process_group("fluxmpi"), whose own
                 excepthook wraps this library's in a StringIO
    exit         the leaver calls sys.exit(0)
    return       the leaver's script simply ends
    exit_early   the leaver exits before the others even enter their collective
    exit_async   the others wait in Iallreduce(...).wait()
    thread_raise an uncaught exception in a thread of the leaver
    clean        every rank finishes normally: exit 0
    root_leaves  many bcast_ from root 0, which exits the moment its last one returns
    slow_peer    rank 0 finishes first; the leaver computes 3 s more, then finishes: exit 0
"""

import os
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import fluxmpi_py as fm  # noqa: E402


def main(mode):
    torch.set_num_threads(1)
    fm.Init()
    if mode == "raise_c10d":
        import torch.distributed as dist

        dist.init_process_group("fluxmpi")
        mode = "raise"
    r, n = fm.local_rank(), fm.total_workers()
    leaver = n - 1
    t = torch.ones(1000)
    fm.allreduce_(t)  # everyone is up
    fm.barrier()
    if mode in ("raise", "exit", "return", "exit_early", "exit_async", "thread_raise"):
        if r == leaver:
            time.sleep(0.5)
            print(f"rank {r} leaves ({mode})", flush=True)
            if mode == "raise":
                raise RuntimeError(f"deliberate failure on rank {r}")
            if mode == "thread_raise":
                th = threading.Thread(target=lambda: 1 / 0)
                th.start()
                th.join()
                time.sleep(30)  # the abort ends this long before
                return
            if mode in ("exit", "exit_early", "exit_async"):
                sys.exit(0)
            return
        if mode == "exit_early":
            time.sleep(3)
        print(f"rank {r} waits in a collective for rank {leaver}", flush=True)
        if mode == "exit_async":
            fm.Iallreduce(t).wait()
        else:
            fm.allreduce_(t)
        print(f"rank {r}: the collective returned, which it must not", flush=True)
        sys.exit(3)
    if mode == "clean":
        for k in range(20):
            fm.allreduce_(t)
            fm.bcast_(t, root_rank=k % n)
        print(f"rank {r} done", flush=True)
        return
    if mode == "root_leaves":
        small = torch.zeros(16)
        for _ in range(200):
            fm.bcast_(small, root_rank=0)
        assert r == 0 or small.sum().item() == 0.0
        print(f"rank {r} done", flush=True)
        return
    if mode == "slow_peer":
        if r == leaver:
            time.sleep(3)
        print(f"rank {r} done", flush=True)
        return
    raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main(sys.argv[1])
