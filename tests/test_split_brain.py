"""Split brain in the shrink mode (issue 51): a cut network looks like death to both sides, and
only one side may go on: a strict majority of the world before the loss, or exactly half when it
holds that world's rank 0. The rule alone (fast), then five ranks on three virtual hosts (2, 2
and 1 ranks, tests/virtual_hosts.py) under the launcher's ULFM switches, the link of node0 cut
mid-training: ranks 2, 3 and 4 (a majority of 5) train on and exit 0 with the right sums, and
ranks 0 and 1 say why they may not go on and end, within the timeout plus 15 s of the cut.
Worker: tests/workers/split_brain_worker.py."""

import os
import re
import shlex
import sys
import tempfile
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import virtual_hosts  # noqa: E402
from mpi_util import mpi_env  # noqa: E402

from fluxmpi_py import _core  # noqa: E402

WORKER = os.path.join(os.path.dirname(__file__), "workers", "split_brain_worker.py")
SLOTS = [2, 2, 1]  # ranks 0, 1 on node0; 2, 3 on node1; 4 on node2
# Open MPI's failure detector, faster than the launcher's defaults (3 s, 10 s) for the test: a
# rank silent for 4 s is suspected, one after the other (the cut side has three to find)
DETECTOR = [("mpi_ft_detector_period", "1"), ("mpi_ft_detector_timeout", "4")]
TIMEOUT = 30  # the job's stall timeout (FLUXMPI_TIMEOUT): the backstop on both sides
START_LIMIT = 120  # seconds for the job to start training on a loaded machine
AFTER = 30  # steps the worker trains on the smaller world


def refusal(old_size, lost):
    return _core.C.quorum_refusal(old_size, lost)


def test_the_rule_a_majority_or_the_half_with_rank_0():
    # a strict majority of the world before the loss goes on, wherever rank 0 is
    assert refusal(5, [0, 1]) == ""
    assert refusal(5, [3]) == ""
    assert refusal(4, [0]) == ""
    assert refusal(3, [0]) == ""
    # exactly half: the half that holds rank 0 goes on, the other ends
    assert refusal(4, [2, 3]) == ""
    assert refusal(2, [1]) == ""
    why = refusal(4, [0, 1])
    assert "2 of the 4 ranks" in why and "exactly half, without that world's rank 0" in why
    assert "lost from here: 0, 1" in why and "exit status 1" in why
    assert refusal(2, [0]) != ""
    # a minority never goes on
    why = refusal(5, [2, 3, 4])
    assert "2 of the 5 ranks" in why and "not a strict majority" in why
    assert refusal(5, [0, 1, 2]) != ""
    assert refusal(3, [1, 2]) != ""
    assert refusal(8, [0, 1, 2, 3, 4]) != ""
    # nothing lost (a shrink that met no loss) goes on
    assert refusal(1, []) == "" and refusal(6, []) == ""


REASON = virtual_hosts.unavailable_reason()
ULFM = _core.C.mpi_library_version().startswith("Open MPI v5")


def _lines_of(proc, into):
    for line in proc.stdout:
        into.append(line)


def _wait_for(predicate, limit, step=0.2):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


@pytest.mark.skipif(REASON is not None, reason=f"no virtual hosts: {REASON}")
@pytest.mark.skipif(not ULFM, reason="the MPI of this build has no ULFM (make builds Open MPI 5)")
def test_a_cut_host_ends_and_the_majority_trains_on():
    lines = []
    with tempfile.TemporaryDirectory(prefix="split-brain-") as logs:
        # each rank's stderr and exit status to a file: the cut host's cannot reach mpiexec
        wrapper = (
            'r="$OMPI_COMM_WORLD_RANK"; "$0" "$1" 2>"$2/rank$r.err"; echo $? >"$2/rank$r.status"'
        )
        argv = ["sh", "-c", wrapper, sys.executable, WORKER, logs]
        with virtual_hosts.VirtualCluster(hosts=len(SLOTS)) as c:
            mca = [("coll", "^han,cuda"), *DETECTOR]
            cmd = c.mpiexec_command(argv, SLOTS, mca)
            # under the launcher, as a user runs it: --elastic passes ELASTIC_MPIEXEC_ARGS; the
            # ranks reach it at the head's address. Its status must be the survivors'.
            launcher = [sys.executable, "-m", "fluxmpi_py.run", "--elastic", "--mpiexec", cmd[0]]
            cmd = [*launcher, "--address", f"{virtual_hosts.SUBNET}.1", *cmd[1:]]
            env = mpi_env({"FLUXMPI_TIMEOUT": str(TIMEOUT)})
            proc = c.start_on_head(cmd, env)
            reader = threading.Thread(target=_lines_of, args=(proc, lines), daemon=True)
            reader.start()

            def text():
                err = "".join(f"== rank {r}:\n{_read(f'{logs}/rank{r}.err')}" for r in range(5))
                return "".join(lines)[-3000:] + "\n" + err[-6000:]

            def status(r):
                s = _read(f"{logs}/rank{r}.status").strip()
                return int(s) if s else None

            try:
                started = _wait_for(lambda: "".join(lines).count(" training") == 5, START_LIMIT)
                assert started, f"no training within {START_LIMIT}s ({shlex.join(cmd)}):\n{text()}"
                time.sleep(1.0)
                c.cut("node0")
                cut = time.monotonic()

                def cut_side_gone():
                    return not c.pids("node0", "split_brain_worker.py")

                gone = _wait_for(cut_side_gone, TIMEOUT + 15, step=0.5)
                left = c.pids("node0")
                print(
                    f"node0's ranks gone {time.monotonic() - cut:.1f} s after the cut; "
                    f"left on node0: {left}"
                )
                assert gone, f"ranks of the cut host live {TIMEOUT + 15}s after the cut:\n{text()}"
                done = _wait_for(lambda: all(status(r) is not None for r in (2, 3, 4)), 60)
                print(f"the majority ended {time.monotonic() - cut:.1f} s after the cut")
                assert done, f"the majority did not finish:\n{text()}"
                # mpiexec waits for node0's daemon, which it cannot reach: the launcher ends it
                # once every rank exited or was lost (keepalive 5 s, --grace 5 s)
                launcher_status = proc.wait(timeout=60)
                reader.join(timeout=10)
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, 9)
                proc.wait()
            out = text()
            print(out)
            for r in (2, 3, 4):
                assert status(r) == 0, out
                m = re.search(rf"rank {r} of 3 finished: steps (\d+) total (\d+) sizes (.*)", out)
                assert m, out
                steps, total = int(m.group(1)), int(m.group(2))
                k = steps - AFTER  # the step the loss was met in: 5 ranks before, 3 after
                assert m.group(3) == f"[[5, 0], [3, {k}]]", out
                assert total == 5 * k + 3 * AFTER, out
                assert f"lost rank(s) 0, 1 of 5; the 3 survivors went on (this rank was {r})" in out
            assert launcher_status == 0, out
            assert "--elastic: the survivors (ranks 2, 3, 4) exited 0, and so does the job" in out
            for r in (0, 1):
                assert status(r) == 1, out
                said = f"[rank {r} / 5] fluxmpi_py: this side of a split world may not go on: 2 of"
                assert said in out, out
                assert "not a strict majority" in out, out
                assert f"rank {r} of" not in out, out  # it never trained on
