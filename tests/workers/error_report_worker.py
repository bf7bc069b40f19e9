"""What a job prints when the ranks fail together or disagree. Usage: error_report_worker.py
MODE[,MODE...]: several modes run one after another in one launch (the caught ones leave the
job able to go on).

Uncaught, on every rank (the job is aborted; tests/test_failures.py reads the output):
    same_error          allreduce_ with a different shape on each rank: RuntimeError everywhere
    same_error_python   load_checkpoint of a missing file: FileNotFoundError everywhere
    rank0_catches       as same_error, but rank 0 catches it and ends normally
Caught, each rank prints "[R / N] MODE: rank R caught TYPE (every rank: True|False): MESSAGE",
exit 0:
    ctor_vs_allreduce   rank 0 builds a DistributedOptimizer while the others call allreduce_
    step_op_mismatch    rank 0's optimizer averages, the others' sum: step() disagrees
    step_vs_allreduce   rank 0 steps while the others call allreduce_
    sync_vs_allreduce   rank 0 calls synchronize_ while the others call allreduce_
Watchdog:
    sync_peer_exits     the last rank exits while the others call synchronize_
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import fluxmpi_py as fm  # noqa: E402


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def caught(mode, fn):
    r = fm.local_rank()
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the test reads what each rank got
        every = getattr(e, "raised_on_every_rank", False)
        # fluxmpi_println: one write, so that the two ranks' long lines cannot interleave
        fm.fluxmpi_println(f"{mode}: rank {r} caught {type(e).__name__} (every rank: {every}): {e}")
    else:
        fm.fluxmpi_println(f"{mode}: rank {r}: no error, which is wrong")


def main(modes):
    torch.set_num_threads(1)
    fm.Init()
    r = fm.local_rank()
    for mode in modes.split(","):
        fm.barrier()
        run(mode)
    # One write per line: print() writes the text and the newline separately, and another
    # rank's line could land between them.
    sys.stdout.write(f"rank {r} done\n")
    sys.stdout.flush()


def run(mode):
    r, n = fm.local_rank(), fm.total_workers()
    if mode == "same_error":
        fm.allreduce_(torch.ones(3 + r))
    elif mode == "rank0_catches":
        # The other ranks wait this long for rank 0's abort before their own (20 s by
        # default); what is tested is that they report and end the job, not the wait's length.
        from fluxmpi_py.runtime import excepthooks

        excepthooks._ABORT_WAIT_S = 4.0
        try:
            fm.allreduce_(torch.ones(3 + r))
        except RuntimeError:
            if r != 0:
                raise
    elif mode == "same_error_python":
        fm.load_checkpoint(os.path.join(os.path.dirname(__file__), "no-such-checkpoint.pt"))
    elif mode == "ctor_vs_allreduce":
        m = model()
        if r == 0:
            caught(mode, lambda: fm.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1)))
        else:
            caught(mode, lambda: fm.allreduce_(torch.ones(5)))
    elif mode in ("step_op_mismatch", "step_vs_allreduce"):
        m = model()
        op = "average" if r == 0 or mode == "step_vs_allreduce" else "sum"
        opt = fm.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), op=op)
        if r == 0 or mode == "step_op_mismatch":
            m(torch.ones(2, 4)).sum().backward()
            caught(mode, opt.step)
        else:
            caught(mode, lambda: fm.allreduce_(torch.ones(5)))
    elif mode == "sync_vs_allreduce":
        m = model()
        if r == 0:
            caught(mode, lambda: fm.synchronize_(m))
        else:
            caught(mode, lambda: fm.allreduce_(torch.ones(5)))
    elif mode == "sync_peer_exits":
        if r == n - 1:
            sys.exit(0)
        fm.synchronize_(model())
        print(f"rank {r}: synchronize_ returned, which it must not", flush=True)
        sys.exit(3)
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main(sys.argv[1])
