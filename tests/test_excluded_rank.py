"""A rank that hangs alone on its host, in the shrink mode (issue 51's gap): Open MPI's failure
detector declares it failed and the survivors go on, but no survivor shares its host, so none
can end it (runtime/fault_tolerance.cpp ends a hung rank only on its own host). The survivors
tell the launcher which process they excluded (``excluded PID START`` on their line to it);
the launcher tells the excluded rank (whose own thread ends it, if it runs at all), ends it
itself where it runs on the launcher's host, and otherwise ends mpiexec once the survivors
have exited, whose daemon ends it on its host. Two virtual hosts (tests/virtual_hosts.py):
ranks 0-2 on node0, rank 3 alone on node1, where it stops itself (SIGSTOP) before call 3.
Worker: tests/workers/hung_rank_worker.py. Then each side alone on one machine, without MPI: the
launcher with a stand-in mpiexec (as in test_run.py), and a rank with a stand-in launcher."""

import os
import re
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import virtual_hosts  # noqa: E402
from mpi_util import mpi_env  # noqa: E402

from fluxmpi_py import _core  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(os.path.dirname(__file__), "workers", "hung_rank_worker.py")
SLOTS = [3, 1]  # ranks 0, 1, 2 on node0; rank 3 alone on node1
# Open MPI's failure detector, faster than the launcher's defaults (3 s, 10 s) for the test
DETECTOR = [("mpi_ft_detector_period", "1"), ("mpi_ft_detector_timeout", "4")]
TIMEOUT = 60  # the job's stall timeout (FLUXMPI_TIMEOUT): a backstop
END_WITHIN = 180  # seconds for the whole launch on a loaded machine

REASON = virtual_hosts.unavailable_reason()
ULFM = _core.C.mpi_library_version().startswith("Open MPI v5")


def _alive(pid):
    """Whether process `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def _launch_to_end(c, cmd):
    """Run `cmd` on the cluster's head; (the process, its output, the stopped rank's pid). Fails
    the test if it has not ended within END_WITHIN seconds."""
    proc = c.start_on_head(cmd, mpi_env({"FLUXMPI_TIMEOUT": str(TIMEOUT)}))
    try:
        out, _ = proc.communicate(timeout=END_WITHIN)
    except subprocess.TimeoutExpired:
        # everything on the hosts first: their daemons hold the output pipe open
        c.close()
        out, _ = proc.communicate()
        pytest.fail(f"the launch did not end within {END_WITHIN}s:\n{out[-4000:]}")
    print(out[-4000:])
    m = re.search(r"rank 3 pid (\d+) stops at", out)
    assert m, out[-4000:]
    return proc, out, int(m.group(1))


@pytest.mark.skipif(REASON is not None, reason=f"no virtual hosts: {REASON}")
@pytest.mark.skipif(not ULFM, reason="the MPI of this build has no ULFM (make builds Open MPI 5)")
def test_a_hung_rank_alone_on_its_host_is_ended():
    with virtual_hosts.VirtualCluster(hosts=len(SLOTS)) as c:
        cmd = c.mpiexec_command([sys.executable, WORKER], SLOTS, [("coll", "^han,cuda"), *DETECTOR])
        launcher = [sys.executable, "-m", "fluxmpi_py.run", "--elastic", "--mpiexec", cmd[0]]
        cmd = [*launcher, "--address", f"{virtual_hosts.SUBNET}.1", *cmd[1:]]
        proc, out, stopped = _launch_to_end(c, cmd)
        # the survivors went on with the right sums, and the job's status is theirs
        for r in range(3):
            assert f"rank {r} of 3: sums [4, 4, 4, 3, 3, 3, 3, 3]" in out, out[-4000:]
        assert proc.returncode == 0, out[-4000:]
        # the launcher named the excluded rank, and it is gone, with nothing else left running
        assert re.search(rf"excluded by the survivors: rank 3 \(pid {stopped} on node1\)", out), out
        deadline = time.monotonic() + 10
        while _alive(stopped) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(stopped), f"the hung rank (pid {stopped}) still runs:\n{out[-4000:]}"
        left = {h: c.pids(h) for h in c.hosts}
        assert not any(left.values()), f"left running: {left}\n{out[-4000:]}"


@pytest.mark.skipif(REASON is not None, reason=f"no virtual hosts: {REASON}")
@pytest.mark.skipif(not ULFM, reason="the MPI of this build has no ULFM (make builds Open MPI 5)")
def test_plain_mpiexec_ends_a_rank_hung_alone_on_its_host():
    # The same job under plain mpiexec, no launcher: the lowest survivor asks mpiexec's runtime
    # (PMIx job control) to end the excluded process, whose daemon on node1 does; without that
    # mpiexec waits for it after the survivors exit, until END_WITHIN fails the test.
    with virtual_hosts.VirtualCluster(hosts=len(SLOTS)) as c:
        # what the launcher's --elastic adds (fluxmpi_py/run.py), by hand
        ft = [("mpi_ft_detector", "true"), ("mpi_ft_propagator_with_rbcast", "true")]
        ft += [("coll", "^han,cuda"), *DETECTOR]
        cmd = c.mpiexec_command([sys.executable, WORKER], SLOTS, ft)
        cmd = [cmd[0], "--with-ft", "ulfm", *cmd[1:]]
        _, out, stopped = _launch_to_end(c, cmd)
        for r in range(3):
            assert f"rank {r} of 3: sums [4, 4, 4, 3, 3, 3, 3, 3]" in out, out[-4000:]
        said = f"[rank 0 / 4] fluxmpi_py: asked mpiexec to end excluded rank 3 (pid {stopped} on"
        assert said in out, out[-4000:]
        assert not _alive(stopped), out[-4000:]
        left = {h: c.pids(h) for h in c.hosts}
        assert not any(left.values()), f"left running: {left}\n{out[-4000:]}"


# Two "ranks" that connect to the launcher as Init does: rank 1 writes its pid to a file and
# stops itself (SIGSTOP); rank 0, a survivor, tells the launcher it excluded rank 1's process, as
# recover() does, then says it exits 0. The stand-in waits for both, as mpiexec waits for every
# process. The ranks' output goes nowhere: a stopped one would hold the launcher's pipes open.
EXCLUDING_MPIEXEC = textwrap.dedent(
    """\
    #!{python}
    import subprocess, sys
    if sys.argv[1:] == ["--version"]:
        print("a stand-in for mpiexec"); sys.exit(0)
    load = "import importlib.util as u, os, signal, sys, time; "
    load += "s = u.spec_from_file_location('link', {link!r}); m = u.module_from_spec(s); "
    load += "s.loader.exec_module(m); "
    hung = load + "m.connect(1, 2); open({pid_file!r}, 'w').write(str(os.getpid())); "
    hung += "os.kill(os.getpid(), signal.SIGSTOP)"
    survivor = load + "fd = m.connect(0, 2); pid = int(sys.argv[1]); time.sleep(1); "
    survivor += "os.write(fd, b'excluded %d %d' % (pid, m.process_start(pid)) + bytes([10])); "
    survivor += "time.sleep(1); os.write(fd, b'exit 0' + bytes([10]))"
    quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ranks = [subprocess.Popen([sys.executable, "-c", hung], **quiet)]
    ranks.append(subprocess.Popen([sys.executable, "-c", survivor, str(ranks[0].pid)], **quiet))
    for p in ranks:
        p.wait()
    sys.exit(0)
    """
)


def test_the_launcher_ends_an_excluded_rank_on_its_host(tmp_path):
    fake, pid_file = tmp_path / "mpiexec", tmp_path / "hung.pid"
    link = os.path.join(ROOT, "fluxmpi_py", "runtime", "launcher_link.py")
    fake.write_text(
        EXCLUDING_MPIEXEC.format(python=sys.executable, link=link, pid_file=str(pid_file))
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "fluxmpi_py.run", "--elastic", "--mpiexec", str(fake), "x"]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        pid = int(pid_file.read_text())
        hung_then = _alive(pid)
    finally:
        if pid_file.exists() and _alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)  # never leave it behind
    err = proc.stderr
    assert proc.returncode == 0, err
    said = f"excluded by the survivors: rank 1 (pid {pid} on {socket.gethostname()}), which still"
    assert said in err and "ended it (SIGKILL)" in err, err
    assert not hung_then, err


def test_a_rank_told_it_was_excluded_ends_itself(tmp_path):
    # A rank that still runs (its Python busy, here asleep) when the launcher tells it that the
    # survivors excluded it: its own thread ends it, saying why, with status 1. One rank, no
    # mpiexec, a listening socket as the launcher.
    server = socket.create_server(("127.0.0.1", 0))
    code = "import time, fluxmpi_py as fm; fm.Init(verbose=False); print('up', flush=True); "
    code += "time.sleep(600)"
    env = dict(os.environ, FLUXMPI_RUN_ADDRESS=f"127.0.0.1:{server.getsockname()[1]}")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    rank = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        server.settimeout(240)
        conn, _ = server.accept()
        assert rank.stdout.readline() == b"up\n"
        conn.sendall(b"excluded\n")
        _, err = rank.communicate(timeout=60)
    finally:
        if rank.poll() is None:
            rank.kill()
            rank.communicate()
    assert rank.returncode == 1, err
    assert b"[rank 0 / 1] fluxmpi_py: the other ranks excluded this rank" in err, err
