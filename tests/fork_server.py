"""The suite's fork server: ranks and worlds of one forked from a warm process.

Each rank of a test's ``mpiexec -n N python script.py`` pays for starting Python and importing
torch and fluxmpi_py (and torch._dynamo at its first optimizer): about 3 CPU seconds, most of
what a short multi-rank test costs, and the suite launches some 200 such ranks. Here mpiexec
starts a small client instead (``python -S fork_server.py script.py ARGS``, no torch): it hands
its standard streams, environment, working directory and arguments to a server that imported
those modules once, and the server forks the rank from there. The rank is then what the
script would be in a fresh interpreter: its own process, with mpiexec's environment (so
``MPI_Init`` joins the job through PMIx as usual), the script as ``__main__``, the exit
functions at its end and the same exit status, which the client exits with. MPI is not
initialised in the server, and no torch op or thread has run there.

A rank that needs a real interpreter gets one: where the job's environment differs from the
server's in a variable read while importing (Python's, torch's, OpenMP's, FLUXMPI_DEBUG,
LD_*), where the rank runs in other namespaces (a virtual host), where the script imports
mpi4py (the order of the two imports is what such a script tests), or where no server is
reachable, the client ``exec``s ``python script.py ARGS`` in its own place, so the launch means
the same either way.

Lifetimes, so that nothing outlives its job:
- the server forks a monitor per rank, which forks the rank and waits on both the rank and the
  client's socket: a client that dies closes the socket, and the monitor kills the rank;
- the client ends when mpiexec does (mpiexec gives each rank a process group of its own, so a
  test's timeout that kills mpiexec's group does not reach the client), and so does its rank;
- the rank dies with its monitor (PR_SET_PDEATHSIG), and the monitor ends when the rank does;
- the client passes on the signals mpiexec sends (SIGTERM, SIGINT, ...) to the rank;
- the server ends when its parent closes its standard input (the pytest process ending).

The suite's worlds of one (``python -c CODE ARGS`` without mpiexec: doc blocks, docstring
examples, world-of-one checks) are forked the same way: tests/forks.py hands the server such a
job, with files for its output, as this file's client hands it a rank.

This file is the server and mpiexec's client; tests/forks.py is pytest's side (it starts the
server). ``FLUXMPI_TEST_WARM=0`` turns it off for a session (every rank a fresh interpreter);
``FLUXMPI_TEST_WARM_LOG=path`` keeps the servers' log (which ranks ran fresh, and why). A test
of what happens while Python starts passes ``fresh=True`` to ``mpi_util._command``.
"""

import array
import json
import os
import select
import signal
import socket
import struct
import sys

SOCKET_ENV = "FLUXMPI_TEST_WARM_SOCKET"  # where the client finds the server
# Variables read while Python, torch or fluxmpi_py start: a rank whose value differs from the
# server's needs a fresh interpreter. (OMPI_ and PMIX_ are read by MPI_Init, in the rank.)
READ_AT_START = ("PYTHON", "TORCH", "OMP_", "MKL_", "KMP_", "LD_", "CUDA", "FLUXMPI_DEBUG")
FORWARDED = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGCONT,
    signal.SIGTSTP,
)


def _start_env(env):
    out = {k: v for k, v in env.items() if k.startswith(READ_AT_START)}
    if "LD_LIBRARY_PATH" in out:  # less what mpiexec adds: the library folder of its prefix
        kept = [p for p in out.pop("LD_LIBRARY_PATH").split(":") if p and p not in _MPI_LIBS]
        if kept:
            out["LD_LIBRARY_PATH"] = ":".join(kept)
    return out


def _mpi_libs():
    """The folders an absolute-path mpiexec puts first in its ranks' LD_LIBRARY_PATH (Open MPI
    treats such a call as --prefix): its prefix's lib, as written and resolved."""
    import shutil

    mpiexec = shutil.which("mpiexec")
    if mpiexec is None:
        return ()
    lib = os.path.join(os.path.dirname(os.path.dirname(mpiexec)), "lib")
    real = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(mpiexec))), "lib")
    return (lib, real, os.path.realpath(lib))


_MPI_LIBS = ()


# --- the client: what mpiexec starts ----------------------------------------------------------


def _send(sock, obj, fds):
    """`obj` as JSON after its length, with `fds` passed along with the length."""
    data = json.dumps(obj).encode()
    rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
    sock.sendmsg([struct.pack("!I", len(data))], rights)
    sock.sendall(data)


def _recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _recv_job(sock):
    """(job dict, the three fds) from a client."""
    fds = array.array("i")
    head, ancdata, _, _ = sock.recvmsg(4, socket.CMSG_SPACE(3 * fds.itemsize))
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    if len(head) < 4:
        head += _recv_exact(sock, 4 - len(head)) or b""
    (n,) = struct.unpack("!I", head)
    return json.loads(_recv_exact(sock, n)), list(fds)


def _fresh(argv):
    os.execv(sys.executable, [sys.executable, *argv])


def submit(path, job, fds):
    """Hand `job` and its three standard streams' fds to the server at `path`: (the socket,
    what the monitor said so far) once a monitor runs it, or None where the server refused it
    (a job for a fresh interpreter) or is not there."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    buf = b""
    try:
        sock.connect(path)
        _send(sock, job, fds)
        while b"\n" not in buf:
            chunk = sock.recv(4096)
            if not chunk:
                break
            buf += chunk
    except OSError:
        pass
    if not buf.startswith(b"pid "):
        sock.close()
        return None
    return sock, buf


def exit_status(sock, buf, idle):
    """The job's exit status as the monitor reports it (-N: killed by signal N), or None where
    the monitor ended without one. `idle()` runs each half second without news (a caller's
    deadline, a parent's death)."""
    while b"exit " not in buf or not buf.endswith(b"\n"):
        if not select.select([sock], [], [], 0.5)[0]:
            idle()
            continue
        chunk = sock.recv(4096)
        if not chunk:
            return None
        buf += chunk
    return int(buf[buf.index(b"exit ") :].split()[1])


def client(argv):
    path = os.environ.get(SOCKET_ENV)
    if not path:
        _fresh(argv)
    job = {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "ns": _namespaces()}
    got = submit(path, job, fds=(0, 1, 2))
    if got is None:
        _fresh(argv)  # refused (its environment) or no server: a fresh interpreter
    sock, buf = got

    def forward(signum, _frame):
        try:
            sock.sendall(f"sig {signum}\n".encode())
        except OSError:
            pass

    for s in FORWARDED:
        signal.signal(s, forward)
    parent = os.getppid()

    def orphaned():
        # mpiexec puts each rank in a process group of its own: one that is killed (a test's
        # timeout) leaves its ranks running. A client that outlives it ends, and so its rank.
        if os.getppid() != parent:
            os._exit(1)

    code = exit_status(sock, buf, orphaned)
    if code is None:
        sys.stderr.write("fork_server: the rank's monitor ended without an exit status\n")
        os._exit(1)
    if code < 0:  # the rank died of a signal: so does the client
        for s in FORWARDED:
            signal.signal(s, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        code = 128 - code
    os._exit(code)


# --- the server: imports once, forks a monitor per rank ---------------------------------------


def serve(path, preload):
    """Import, then fork a monitor and a rank per client until the parent ends. Returns only
    in a rank: (job, its three fds, what the imports set), for the top level to run."""
    global _MPI_LIBS
    _MPI_LIBS = _mpi_libs()
    before = dict(os.environ)
    start_env = _start_env(before)
    import torch  # noqa: F401  (the point: imported once, before any fork)

    import fluxmpi_py  # noqa: F401

    for name in preload:
        __import__(name)
    # what the imports set (OMPI_MCA_mpi_yield_when_idle, TORCHINDUCTOR_CACHE_DIR): a rank's
    # imports would set them too
    set_by_imports = {k: v for k, v in os.environ.items() if k not in before}
    namespaces = _namespaces()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the monitors reap themselves
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        ready, _, _ = select.select([listener, sys.stdin], [], [])
        if sys.stdin in ready and not os.read(sys.stdin.fileno(), 4096):
            sys.exit(0)  # the parent ended
        if listener not in ready:
            continue
        conn, _ = listener.accept()
        try:
            job, fds = _recv_job(conn)
        except (OSError, ValueError, TypeError):
            conn.close()
            continue
        why = _why_fresh(job, start_env, set_by_imports, namespaces)
        if why:
            print(f"fork_server: fresh interpreter for {job['argv'][:1]}: {why}", file=sys.stderr)
            conn.sendall(b"fresh\n")
        elif os.fork() == 0:  # the monitor
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            pid = os.fork()
            if pid == 0:  # the rank
                conn.close()
                return job, fds, set_by_imports
            _monitor(conn, pid, fds, path + ".cpu")  # never returns
        for fd in fds:
            os.close(fd)
        conn.close()


def _why_fresh(job, start_env, set_by_imports, namespaces):
    """Why this rank cannot be forked from the server (None: it can)."""
    theirs = _start_env(job["env"])
    for k, v in set_by_imports.items():  # set by an import in the launching process: the same
        if theirs.get(k) == v and k not in start_env:
            del theirs[k]
    keys = sorted(k for k in set(theirs) | set(start_env) if theirs.get(k) != start_env.get(k))
    if keys:
        return "its environment differs: " + ", ".join(
            f"{k}={theirs.get(k)!r} (here {start_env.get(k)!r})" for k in keys
        )
    other = sorted(k for k, v in job.get("ns", {}).items() if v != namespaces.get(k))
    if other:
        return "it runs in other namespaces: " + ", ".join(other)
    argv = job["argv"]
    if argv[:1] == ["-c"] and len(argv) > 1:
        text = argv[1]
    elif not argv or argv[0].startswith("-"):
        return "not `python SCRIPT ARGS` nor `python -c CODE ARGS` (the forms served)"
    else:
        text = _text_of(os.path.join(job["cwd"], argv[0]))
    if "import mpi4py" in text or "from mpi4py" in text:
        return "it imports mpi4py, whose order against fluxmpi_py's import matters"
    return None


def _text_of(script):
    try:
        with open(script, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return ""


def _monitor(conn, pid, fds, cpu_log):
    """In the monitor (a child of the server, the rank's parent): tell the client the rank's
    pid, pass on its signals, kill the rank when the client goes, report the rank's exit and
    add its CPU seconds to `cpu_log` (the suite's CPU count: cpu_seconds())."""
    code = 1
    try:
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        conn.sendall(f"pid {pid}\n".encode())
        pending = b""
        while True:
            ready, _, _ = select.select([conn, pidfd], [], [])
            if pidfd in ready:
                _, status, usage = os.wait4(pid, 0)
                with open(cpu_log, "a") as f:
                    f.write(f"{usage.ru_utime + usage.ru_stime:.3f}\n")
                try:
                    conn.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
                except OSError:
                    pass
                code = 0
                break
            data = conn.recv(4096)
            if not data:  # the client is gone (its job ended or was killed): so is the rank
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                break
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                if line.startswith(b"sig "):
                    try:
                        os.kill(pid, int(line.split()[1]))
                    except (OSError, ValueError):
                        pass
    finally:
        os._exit(code)


def _namespaces():
    out = {}
    for ns in ("net", "uts", "mnt", "pid", "ipc", "user"):
        try:
            out[ns] = os.readlink(f"/proc/self/ns/{ns}")
        except OSError:
            out[ns] = None
    return out


def become_rank(job, fds, set_by_imports):
    """In the rank, at the top level: become ``python SCRIPT ARGS`` (or ``python -c CODE ARGS``)
    as it was started and run it. The interpreter's own exit follows (threads joined, exit functions, mpi4py's
    finalize, the exit status of a SystemExit or an uncaught exception)."""
    import ctypes
    import runpy

    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the monitor
    if os.getppid() == 1:
        os._exit(1)
    for s in (signal.SIGCHLD, *FORWARDED):
        signal.signal(s, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for i, fd in enumerate(fds):
        os.dup2(fd, i)
        os.close(fd)
    os.environ.clear()
    os.environ.update(job["env"])
    for k, v in set_by_imports.items():
        os.environ.setdefault(k, v)
    os.chdir(job["cwd"])
    # what importing fluxmpi_py read from the environment, read again from the rank's
    from fluxmpi_py.runtime import preferences

    preferences._CUDAMPI_ENABLED = not preferences._read_prefs().get("disable_cudampi", False)
    base_path = sys.path[1:]  # sys.path[0] is this file's folder
    argv = job["argv"]
    if argv[0] == "-c":
        os._exit(_run_code(argv, base_path))
    sys.argv = list(argv)
    sys.path[:] = [os.path.dirname(os.path.abspath(argv[0])), *base_path]
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit:
        raise
    except BaseException as e:  # as the interpreter reports it, without this file's frames
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in (__file__, "<frozen runpy>"):
            tb = tb.tb_next
        # Python's report of an exception reads its __traceback__ (the argument only when
        # that is None), so the shortened one is set on the exception itself.
        sys.excepthook(type(e), e.with_traceback(tb), tb)  # fluxmpi_py's: ends the job
        if isinstance(e, KeyboardInterrupt):
            # The interpreter's own ending follows (shutdown, then death by SIGINT); its report
            # of the exception is the one just printed, whose frames start at the script's.
            sys.excepthook = lambda *exc: None
            raise
        sys.exit(1)


def _run_code(argv, base_path):
    """A world of one (tests/forks.py), ``python -c CODE ARGS``: run it, then end as the
    interpreter does (threads joined, exit functions, streams flushed) but for its teardown of
    every module, seconds with torch imported. Returns the exit status. The job has a process
    group of its own: the caller kills it at its timeout, with whatever the job started."""
    import atexit
    import threading

    os.setpgid(0, 0)
    sys.argv = ["-c", *argv[2:]]
    sys.path[:] = ["", *base_path]
    main = type(sys)("__main__")
    sys.modules["__main__"] = main
    code = 0
    try:
        exec(compile(argv[1], "<string>", "exec"), main.__dict__)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException as e:
        tb = e.__traceback__.tb_next if e.__traceback__ else None  # from the code's own frame
        sys.excepthook(type(e), e.with_traceback(tb), tb)
        code = 1
    try:
        threading._shutdown()
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return code


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        become_rank(*serve(sys.argv[2], sys.argv[3:]))
    else:
        client(sys.argv[1:])
