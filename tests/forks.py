"""The suite's fork server (tests/fork_server.py), from pytest's side: one server per pytest
process, started at its first use, for both kinds of launch:

- ranks under mpiexec: ``python()`` is the interpreter part of the command line (the server's
  client, ``python -S fork_server.py``), which tests/mpi_util.py puts after ``mpiexec -n N``;
- worlds of one: ``run(code, args)`` is ``python -c CODE ARGS`` without mpiexec, and
  ``run_file(path, args)`` is ``python PATH ARGS``: a process of its own (its own MPI
  singleton, globals and exit) forked from the server, with its output collected, as
  ``subprocess.run(..., capture_output=True, text=True)`` would return it.

Starting Python and importing torch and fluxmpi_py costs 2-3 s of CPU per process, most of
what a short check costs; the server imported them once. A job whose environment sets what
the imports read gets a fresh interpreter instead, so that it means the same either way.
"""

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import fork_server
from launch_env import ROOT, SUITE_ENV, singleton_env

# Variables read while importing fluxmpi_py (the FLUXMPI_DEBUG mode) or by MPI's singleton
# start, beyond those the server itself refuses (fork_server.READ_AT_START): a world of one
# that sets them runs in a fresh interpreter.
READ_AT_IMPORT = ("FLUXMPI_DEBUG", "OMPI_", "PMIX_", "OMP_", "PYTHON", "TORCH", "CUDA", "LD_")
CLIENT = os.path.abspath(fork_server.__file__)
_SERVER = []  # (process, socket path, folder, log)


def enabled():
    return os.environ.get("FLUXMPI_TEST_WARM", "1") != "0"


def python(fresh=False):
    """The interpreter part of an mpiexec command line: the client (``python -S`` the server's
    file, with the server started) unless `fresh` or turned off."""
    if fresh or not enabled():
        return [sys.executable]
    start()
    return [sys.executable, "-S", CLIENT]


def cpu_seconds():
    """The CPU seconds of every forked job that has ended, so far (they are the server's
    grandchildren: no rusage of this process counts them)."""
    try:
        with open(_SERVER[0][1] + ".cpu") as f:
            return sum(float(x) for x in f.read().split())
    except (IndexError, OSError):
        return 0.0


def start():
    if _SERVER:
        return
    folder = tempfile.mkdtemp(prefix="fork-server-")
    path = os.path.join(folder, "socket")
    config = os.path.join(folder, "config")  # no preferences: kept empty
    os.mkdir(config)
    # which jobs ran fresh, and why: FLUXMPI_TEST_WARM_LOG=path keeps it
    log = open(os.environ.get("FLUXMPI_TEST_WARM_LOG") or os.path.join(folder, "log"), "a")
    proc = subprocess.Popen(
        [sys.executable, CLIENT, "--serve", path, "torch._dynamo"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        env=singleton_env({"FLUXMPI_PY_CONFIG_DIR": config}),
        cwd=ROOT,
        text=True,
    )
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        raise RuntimeError(f"the fork server did not start: see {log.name}")
    _SERVER.append((proc, path, folder, log))
    SUITE_ENV[fork_server.SOCKET_ENV] = path  # every later launch's clients find it

    def stop():
        proc.stdin.close()
        proc.wait(timeout=30)
        proc.stdout.close()
        log.close()
        shutil.rmtree(folder, ignore_errors=True)

    atexit.register(stop)


def read_at_import(env_extra):
    """The variables of `env_extra` that a forked world of one would see too late. The
    preferences are read at import from FLUXMPI_PY_CONFIG_DIR; the server imported with an
    empty one, so another empty one is the same to a job."""
    late = [k for k in env_extra or {} if k.startswith(READ_AT_IMPORT)]
    config = (env_extra or {}).get("FLUXMPI_PY_CONFIG_DIR")
    if config and os.path.isdir(config) and os.listdir(config):
        late.append("FLUXMPI_PY_CONFIG_DIR (not empty)")
    return late


def run(code, args=(), env_extra=None, cwd=ROOT, timeout=180):
    """``python -c CODE ARGS`` as a world of one in `cwd`, with the suite's environment and
    `env_extra`: a ``subprocess.CompletedProcess`` (exit code, stdout and stderr as text), or
    ``subprocess.TimeoutExpired`` after `timeout` seconds (the job and what it started
    killed)."""
    argv = ["-c", code, *map(str, args)]
    env = singleton_env(env_extra)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        got = None
        if enabled() and not read_at_import(env_extra):
            start()
            job = {"argv": argv, "env": env, "cwd": str(cwd), "ns": fork_server._namespaces()}
            with open(os.devnull) as null:
                got = fork_server.submit(
                    _SERVER[0][1], job, (null.fileno(), out.fileno(), err.fileno())
                )
        if got is None:  # refused (what its environment sets) or turned off: a fresh one
            return subprocess.run(
                [sys.executable, *argv],
                env=env,
                cwd=cwd,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        sock, buf = got
        pid = int(buf.split()[1])
        deadline = time.monotonic() + timeout

        def past_deadline():
            if time.monotonic() > deadline:
                raise TimeoutError

        try:
            status = fork_server.exit_status(sock, buf, past_deadline)
        except TimeoutError:
            _kill(pid)
            raise subprocess.TimeoutExpired(
                argv[:1] + argv[2:], timeout, _text(out), _text(err)
            ) from None
        finally:
            sock.close()
        return subprocess.CompletedProcess(
            argv[:1] + argv[2:], 1 if status is None else status, _text(out), _text(err)
        )


def run_file(path, args=(), **kw):
    """``python PATH ARGS`` as ``run`` runs code: argv[0], __file__ and sys.path[0] as Python
    sets them for a script."""
    code = (
        "import os, runpy, sys\n"
        f"path = {os.path.abspath(path)!r}\n"
        "sys.argv[0] = path\n"
        "sys.path.insert(0, os.path.dirname(path))\n"
        "runpy.run_path(path, run_name='__main__')\n"
    )
    return run(code, args, **kw)


def _kill(pid):
    """The job's process group (it made one of its own), or the job alone if it has not yet."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _text(f):
    f.seek(0)
    return f.read().decode("utf-8", "replace")
