"""Persistent preferences, as FluxMPI keeps them: a JSON file read once per process.

The file is ``$FLUXMPI_PY_CONFIG_DIR/preferences.json`` (default
``$XDG_CONFIG_HOME/fluxmpi_py``, else ``~/.config/fluxmpi_py``). A changed preference takes
effect at the next start of Python.
"""

from __future__ import annotations

import json
import os

from .._util.files import write_atomic
from .entry import local_call

__all__ = ["disable_cudampi_support", "cudampi_enabled"]


def _prefs_path() -> str:
    base = os.environ.get("FLUXMPI_PY_CONFIG_DIR") or os.path.join(
        os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config"), "fluxmpi_py"
    )
    return os.path.join(base, "preferences.json")


def _read_prefs() -> dict:
    try:
        with open(_prefs_path()) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


# Read once per process: like FluxMPI, a changed preference takes effect at the next start.
_CUDAMPI_ENABLED = not _read_prefs().get("disable_cudampi", False)


@local_call
def disable_cudampi_support(disable: bool = True) -> str:
    """Persist whether CUDA tensors may be handed to MPI directly (CUDA-aware MPI).

    Takes effect at the next start of Python, as in FluxMPI. Returns the preferences file.
    CUDA tensors travel through NCCL; the collectives NCCL lacks (gather, scatter, alltoall)
    go over MPI, with device pointers when the MPI library is CUDA-aware, or staged through
    host memory when it is not or this preference disables it. Reported by
    ``build_info()["cuda_mpi_enabled"]``.

    Args:
        disable: True: stage CUDA tensors through host memory for MPI; False: allow CUDA-aware MPI.

    Returns:
        The path of the preferences file written.

    >>> import fluxmpi_py as fm, os, tempfile
    >>> os.environ["FLUXMPI_PY_CONFIG_DIR"] = tempfile.mkdtemp()
    >>> path = fm.disable_cudampi_support(True)
    >>> import json; json.load(open(path))["disable_cudampi"]
    True
    """
    path = _prefs_path()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    prefs = _read_prefs()
    prefs["disable_cudampi"] = bool(disable)
    write_atomic(path, json.dumps(prefs).encode())
    return path


@local_call
def cudampi_enabled() -> bool:
    """Whether CUDA-aware MPI use is enabled for this process (see disable_cudampi_support).

    >>> import fluxmpi_py as fm; isinstance(fm.cudampi_enabled(), bool)
    True
    """
    return _CUDAMPI_ENABLED
