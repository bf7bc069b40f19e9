"""How long a job takes to end after one of its hosts is cut off (issue 35).

`sudo .venv/bin/python benchmarks/lost_host.py` makes 2 virtual hosts of 2 ranks
(tests/virtual_hosts.py), starts tests/workers/lost_host_worker.py (training with
Init(stall_warning=3, timeout=30)), cuts node1's link once every rank trains, and records, in
seconds after the cut: the first stall report naming the silent ranks, the moment no training
process is left on each host, and when the launch returned (or that it had not, when the run
was ended from outside after --limit seconds). Each launch is one row:

    mpiexec                    plain mpiexec, Open MPI's defaults
    mpiexec+keepalive          plain mpiexec with oob_tcp_keepalive_{time,intvl,probes}=5,2,3
    fluxmpi_py.run             python -m fluxmpi_py.run over plain mpiexec

Results as JSON lines on stdout; `--only NAME` runs one row.
"""

import argparse
import json
import os
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
import virtual_hosts  # noqa: E402
from mpi_util import mpi_env  # noqa: E402

WORKER = os.path.join(os.path.dirname(HERE), "tests", "workers", "lost_host_worker.py")
KEEPALIVE = (
    ("oob_tcp_keepalive_time", "5"),
    ("oob_tcp_keepalive_intvl", "2"),
    ("oob_tcp_keepalive_probes", "3"),
)
ROWS = {
    "mpiexec": ((), False),
    "mpiexec+keepalive": (KEEPALIVE, False),
    "fluxmpi_py.run": ((), True),
}


def one(name, limit, timeout):
    mca, launcher = ROWS[name]
    lines = []
    with virtual_hosts.VirtualCluster(hosts=2) as c:
        cmd = c.mpiexec_command([sys.executable, WORKER], 2, mca)
        if launcher:
            cmd = [sys.executable, "-m", "fluxmpi_py.run", *cmd[1:]]
        env = mpi_env({"FLUXMPI_TEST_TIMEOUT": str(timeout)})
        proc = c.start_on_head(cmd, env)

        def read():
            for line in proc.stdout:
                lines.append((time.monotonic(), line))

        threading.Thread(target=read, daemon=True).start()
        end = time.monotonic() + 120
        while "".join(ln for _, ln in lines).count(" training") < 4 and time.monotonic() < end:
            time.sleep(0.2)
        time.sleep(1.0)
        c.cut("node1")
        cut = time.monotonic()
        gone = {h: None for h in c.hosts}
        returned = None
        while time.monotonic() - cut < limit:
            for h in c.hosts:
                if gone[h] is None and not c.pids(h, "lost_host_worker.py"):
                    gone[h] = round(time.monotonic() - cut, 1)
            if returned is None and proc.poll() is not None:
                returned = round(time.monotonic() - cut, 1)
            if returned is not None and all(v is not None for v in gone.values()):
                break
            time.sleep(0.25)
        report = next((t for t, ln in lines if "no answer within" in ln), None)
        row = {
            "launch": name,
            "timeout_s": timeout,
            "report_s": None if report is None else round(report - cut, 1),
            "no_rank_left_s": gone,
            "launch_returned_s": returned,
            "status": proc.returncode,
            "limit_s": limit,
            "tail": [ln.rstrip() for _, ln in lines[-4:]],
        }
        if proc.poll() is None:
            proc.kill()
        return row


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", choices=sorted(ROWS))
    p.add_argument("--limit", type=float, default=120.0, help="seconds after the cut")
    p.add_argument("--timeout", type=float, default=30.0, help="the job's Init(timeout=)")
    args = p.parse_args()
    reason = virtual_hosts.unavailable_reason()
    if reason:
        sys.exit(f"no virtual hosts: {reason}")
    for name in [args.only] if args.only else list(ROWS):
        print(json.dumps(one(name, args.limit, args.timeout)), flush=True)


if __name__ == "__main__":
    main()
