"""What a rank sees of how it was started (tests/test_warm_ranks.py; the server:
tests/fork_server.py): a JSON file per rank in $WARM_PROBE_DIR (mpiexec may interleave the
ranks' lines). Usage: warm_probe.py MODE [ARGS];
MODE exit:N, signal:N, print, or sleep (before Init: nothing of MPI's would end it)."""

import json
import os
import sys
import time

WARM = "torch" in sys.modules  # imported before this script ran: forked from the server

import fluxmpi_py as fm  # noqa: E402

mode = sys.argv[1]


def record(rank, world):
    path = os.path.join(os.environ["WARM_PROBE_DIR"], f"rank{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(
            {
                "rank": rank,
                "world": world,
                "warm": WARM,
                "pid": os.getpid(),
                "argv": sys.argv,
                "file": __file__,
                "path0": sys.path[0],
                "cwd": os.getcwd(),
                "probe_var": os.environ.get("WARM_PROBE_VAR"),
                "yield": os.environ.get("OMPI_MCA_mpi_yield_when_idle"),
                "main": __name__,
            },
            f,
        )
    os.rename(path + ".tmp", path)


if mode == "sleep":
    record(int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"]))
    time.sleep(300)
    sys.exit(0)

fm.Init()
rank = fm.local_rank()
record(rank, fm.total_workers())
fm.allreduce_(__import__("torch").ones(1))
if rank == fm.total_workers() - 1:
    if mode.startswith("exit:"):
        sys.exit(int(mode[5:]))
    if mode.startswith("signal:"):
        os.kill(os.getpid(), int(mode[7:]))
        time.sleep(30)
