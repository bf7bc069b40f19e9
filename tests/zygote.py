"""A fork server for the suite's world-of-one subprocesses.

Starting Python and importing torch and fluxmpi_py costs 2-3 s of CPU per process, which is
most of what a short world-of-one check in a fresh process costs. The zygote is one process
that imports them once and then forks a child per job: each job still gets a process of its
own (its own MPI singleton, globals, exit), as a fresh ``python -c CODE ARGS`` would, minus the
imports. Nothing has run in the zygote but the imports: no torch op, no thread, no MPI.

``run(code, args, env_extra=..., timeout=...)`` returns a ``subprocess.CompletedProcess`` with
the child's exit code and its stdout and stderr. The child runs ``code`` as ``__main__`` with
``sys.argv = ["-c", *args]``, then the exit functions (MPI's finalize among them), as a normal
interpreter exit would. ``env_extra`` is applied in the child before ``code`` runs; variables
that the imports read (the FLUXMPI_DEBUG mode, Open MPI's and PMIx's) would be read too late
there, so they are refused: such a job needs a real process (``subprocess.run``).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import ROOT, singleton_env  # noqa: E402

READ_AT_IMPORT = ("FLUXMPI_DEBUG", "OMPI_", "PMIX_", "OMP_", "PYTHON", "TORCH", "CUDA", "LD_")

# The server: imports, then one JSON request per line on stdin, one JSON reply per line on
# its own channel (fd 3 at start, kept apart from anything the imports may print).
SERVER = r"""
import atexit, io, json, os, signal, sys, tempfile, time, traceback
reply = os.fdopen(int(sys.argv[1]), "w", buffering=1)
import torch, fluxmpi_py  # noqa: F401  (the point: imported once, before any fork)
for name in sys.argv[2:]:
    __import__(name)
reply.write(json.dumps({"ready": os.getpid()}) + "\n")
for line in sys.stdin:
    job = json.loads(line)
    out = tempfile.TemporaryFile()
    err = tempfile.TemporaryFile()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.setpgid(0, 0)
            reply.close()
            sys.stdin.close()
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            os.environ.update(job["env"])
            os.chdir(job["cwd"])
            sys.argv = ["-c", *job["args"]]
            main = type(sys)("__main__")
            sys.modules["__main__"] = main
            try:
                exec(compile(job["code"], "<string>", "exec"), main.__dict__)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                if not isinstance(e.code, (int, type(None))):
                    print(e.code, file=sys.stderr)
            except BaseException:
                traceback.print_exc()
                code = 1
            atexit._run_exitfuncs()
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    deadline = time.monotonic() + job["timeout"]
    status = None
    while status is None:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = os.waitstatus_to_exitcode(st)
        elif time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            status = "timeout"
        else:
            time.sleep(0.005)
    texts = []
    for f in (out, err):
        f.seek(0)
        texts.append(f.read().decode("utf-8", "replace"))
        f.close()
    reply.write(json.dumps({"rc": status, "stdout": texts[0], "stderr": texts[1]}) + "\n")
"""


class Zygote:
    """One server process; jobs run one at a time (the suite runs tests one at a time)."""

    def __init__(self, preload=()):
        read_fd, write_fd = os.pipe()
        self._config = tempfile.mkdtemp(prefix="zygote-config-")  # no preferences, kept empty
        self._proc = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(write_fd), *preload],
            stdin=subprocess.PIPE,
            env=singleton_env({"FLUXMPI_PY_CONFIG_DIR": self._config}),
            cwd=ROOT,
            pass_fds=(write_fd,),
            text=True,
        )
        os.close(write_fd)
        self._replies = os.fdopen(read_fd, "r")
        self._lock = threading.Lock()
        first = self._replies.readline()
        if not first:
            raise RuntimeError("the zygote died while importing torch and fluxmpi_py")

    def run(self, code, args=(), env_extra=None, cwd=ROOT, timeout=180):
        env_extra = dict(env_extra or {})
        late = read_at_import(env_extra)
        if late:
            raise ValueError(f"zygote.run: {late} are read at import; run this job with subprocess")
        job = dict(code=code, args=[str(a) for a in args], env=env_extra, cwd=str(cwd))
        job["timeout"] = timeout
        with self._lock:
            self._proc.stdin.write(json.dumps(job) + "\n")
            self._proc.stdin.flush()
            line = self._replies.readline()
        if not line:
            raise RuntimeError(f"the zygote died (exit code {self._proc.poll()})")
        res = json.loads(line)
        if res["rc"] == "timeout":
            raise subprocess.TimeoutExpired(
                ["-c", *job["args"]], timeout, res["stdout"], res["stderr"]
            )
        return subprocess.CompletedProcess(
            ["-c", *job["args"]], res["rc"], res["stdout"], res["stderr"]
        )

    def run_file(self, path, args=(), **kw):
        """``python PATH ARGS`` in a forked child: argv[0], __file__ and sys.path[0] as Python
        sets them for a script."""
        code = (
            "import os, runpy, sys\n"
            f"path = {os.path.abspath(path)!r}\n"
            "sys.argv[0] = path\n"
            "sys.path.insert(0, os.path.dirname(path))\n"
            "runpy.run_path(path, run_name='__main__')\n"
        )
        return self.run(code, args, **kw)

    def close(self):
        self._proc.stdin.close()
        self._proc.wait(timeout=30)
        self._replies.close()
        shutil.rmtree(self._config, ignore_errors=True)


def read_at_import(env_extra):
    """The variables of `env_extra` that a forked child would see too late. The preferences
    are read at import from FLUXMPI_PY_CONFIG_DIR; the zygote imported with an empty one, so
    another empty one is the same to a child."""
    late = [k for k in env_extra or {} if k.startswith(READ_AT_IMPORT)]
    config = (env_extra or {}).get("FLUXMPI_PY_CONFIG_DIR")
    if config and os.path.isdir(config) and os.listdir(config):
        late.append("FLUXMPI_PY_CONFIG_DIR (not empty)")
    return late


_SHARED = []


def shared():
    """The session's zygote, started at the first use and ended when the session exits."""
    if not _SHARED:
        import atexit

        # torch._dynamo too: torch imports it at a process's first optimizer or DDP (1.5-2 CPU
        # seconds), which most docstring examples and doc blocks build
        _SHARED.append(Zygote(preload=("torch._dynamo",)))
        atexit.register(_SHARED[0].close)
    return _SHARED[0]
