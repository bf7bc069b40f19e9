"""Which ``mpiexec`` launches ranks of this build: the one installed beside the MPI library that
this process loaded (``<prefix>/lib/libmpi.so`` -> ``<prefix>/bin/mpiexec``: Open MPI from PyPI
in a venv, a cluster's module), else the first on PATH. A launcher of another MPI release than
the library's (Debian's 4.1 in /usr/bin beside PyPI's 5.0 in the venv) cannot start its ranks."""

from __future__ import annotations

import os
import shutil


def loaded_libmpi() -> str | None:
    """The path of the MPI library mapped into this process (Linux), None when none is.

    >>> loaded_libmpi() is None or "libmpi" in loaded_libmpi()
    True
    """
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1]
                if os.path.basename(path).startswith("libmpi.so"):
                    return path
    except OSError:
        pass
    return None


def default_mpiexec(name: str = "mpiexec") -> str:
    """``name`` (mpiexec or mpirun) beside the loaded MPI library when it has one, else the
    first on PATH, else ``name`` itself (the caller's error then names it).

    >>> os.path.basename(default_mpiexec())
    'mpiexec'
    """
    lib = loaded_libmpi()
    if lib is not None:
        beside = os.path.join(os.path.dirname(os.path.dirname(lib)), "bin", name)
        if os.access(beside, os.X_OK):
            return beside
    return shutil.which(name) or name


def remove_session_dir(pid: int, tmpdir: str | None = None) -> bool:
    """Remove the session directory that Open MPI's ``mpiexec`` (PRRTE) of process `pid` left
    in ``$TMPDIR`` (else /tmp) when it was killed (SIGKILL: a clean end removes its own), if
    that process is gone and the directory is this user's. Whether it removed one.

    PMIx 5.0.11rc1 (in PyPI's Open MPI 5.0.11) refuses to start a server whose rendezvous file
    is already there: a later ``mpiexec`` given the same pid would fail with "The PMIx server's
    listener thread failed to start" (openpmix#4022, fixed upstream by #4046).

    >>> remove_session_dir(os.getpid())  # alive: left alone
    False
    """
    path = os.path.join(tmpdir or os.environ.get("TMPDIR") or "/tmp", f"ompi.{pid}")
    try:
        os.kill(pid, 0)
        return False
    except ProcessLookupError:
        pass
    except OSError:
        return False
    try:
        if os.lstat(path).st_uid != os.getuid() or not os.path.isdir(path):
            return False
    except OSError:
        return False
    shutil.rmtree(path, ignore_errors=True)
    return not os.path.exists(path)
