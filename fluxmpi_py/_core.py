"""The gateway to the compiled core: the only module that imports ``_C`` (when that fails, it
says why and how to fix it), and the vocabulary every layer above shares, written once: the
reduction ops and the root-rank check.

>>> from fluxmpi_py._core import GRADIENT_OPS, parse_root
>>> GRADIENT_OPS["mean"], parse_root(1), parse_root("0")
('average', (1, ''), (0, "root_rank must be an int, got '0' (str)"))
"""

import glob
import importlib.machinery
import operator
import os
import sys

import torch  # noqa: F401  (loads libtorch before our extension)

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_PARENT = os.path.dirname(_PACKAGE_DIR)


def _compiled_core(package_dir: str):
    """The path of the _C extension file in ``package_dir``, or None."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        found = glob.glob(os.path.join(glob.escape(package_dir), "_C" + suffix))
        if found:
            return found[0]
    return None


def _is_source_tree() -> bool:
    return all(os.path.exists(os.path.join(_PARENT, f)) for f in ("setup.py", "csrc"))


def _installed_elsewhere():
    """Another fluxmpi_py with a compiled core that this one hides, or None: on sys.path, or
    behind an import hook (an editable install of another clone)."""
    for entry in sys.path:
        here = os.path.abspath(entry or os.curdir)
        if here == _PARENT:
            continue
        pkg = os.path.join(here, "fluxmpi_py")
        if os.path.exists(os.path.join(pkg, "__init__.py")) and _compiled_core(pkg):
            return pkg
    for finder in sys.meta_path:
        if finder is importlib.machinery.PathFinder:
            continue  # sys.path, above
        try:
            spec = finder.find_spec("fluxmpi_py", None)
        except Exception:  # noqa: BLE001 - a third-party hook; it only informs a message
            continue
        for loc in (spec.submodule_search_locations or []) if spec is not None else []:
            if os.path.abspath(loc) != _PACKAGE_DIR and _compiled_core(loc):
                return os.path.abspath(loc)
    return None


def _why_first() -> str:
    """Why this copy of the package is the one imported."""
    cwd = os.path.abspath(os.curdir)
    first = os.path.abspath(sys.path[0] or os.curdir) if sys.path else None
    if first == _PARENT:
        if _PARENT == cwd:
            return "the current directory is the clone's root"
        return f"the script's directory, {_PARENT} (sys.path[0]), is the clone's root"
    return f"{_PARENT} comes before it on sys.path (PYTHONPATH?)"


def _build_hint() -> str:
    # Not `make build` after a torch change: make sees no changed source and keeps the old core.
    return f"build it in place with `pip install --no-build-isolation -e .` in {_PARENT}"


def load_error(e: ImportError) -> ImportError:
    """The ImportError to raise instead of ``e``, naming the real cause."""
    core = _compiled_core(_PACKAGE_DIR)
    if core is not None:
        return ImportError(
            f"fluxmpi_py's compiled core {core} does not load with the torch in this environment "
            f"(torch {torch.__version__}, {os.path.dirname(torch.__file__)}): {e}. It was most "
            f"likely compiled against another torch; rebuild it against this one: "
            + (
                _build_hint()
                if _is_source_tree()
                else "reinstall it from its source tree with `pip install --no-build-isolation .`"
            )
            + "."
        )
    if not _is_source_tree():
        return ImportError(
            f"the fluxmpi_py package at {_PACKAGE_DIR} has no compiled core (_C): the install is "
            f"incomplete. Reinstall it from the source with pip install --no-build-isolation ."
        )
    installed = _installed_elsewhere()
    if installed is not None:
        return ImportError(
            f"fluxmpi_py is imported from the source tree at {_PACKAGE_DIR}, which has no "
            f"compiled core (_C). The installed package at {installed} is hidden by it because "
            f"{_why_first()}: run from another directory, or {_build_hint()} (or `make build`)."
        )
    return ImportError(
        f"fluxmpi_py is imported from the source tree at {_PACKAGE_DIR}, which has no compiled "
        f"core (_C), and no installed fluxmpi_py was found on sys.path: {_build_hint()} (or "
        f"`make build`), or install it with `pip install --no-build-isolation .`"
    )


try:
    from . import _C  # noqa: F401
except ImportError as _e:
    raise load_error(_e) from None

C = _C


def nccl_mismatch(ours: str, torch_nccl) -> str:
    """The error text when the NCCL our core loaded (``ours``, "2.28.9"; "" without CUDA) is
    not the one torch loaded (``torch_nccl``, torch.cuda.nccl.version(): a tuple, or None when
    torch has none); "" when they agree. Two NCCL libraries in one process would each keep their
    own state, and their communicators could not be mixed.

    >>> nccl_mismatch("2.28.9", (2, 28, 9)), nccl_mismatch("", (2, 28, 9))
    ('', '')
    >>> "built with NCCL 2.28.9, but torch loaded NCCL 2.27.3" in nccl_mismatch("2.28.9", (2, 27, 3))
    True
    """
    if not ours or torch_nccl is None:
        return ""
    theirs = ".".join(str(part) for part in torch_nccl[:3])
    if theirs == ours:
        return ""
    return (
        f"fluxmpi_py was built with NCCL {ours}, but torch loaded NCCL {theirs}: two NCCL "
        "libraries in one process cannot share communicators. Rebuild fluxmpi_py against torch's "
        "NCCL (the nvidia-nccl wheel torch depends on, or NCCL_HOME pointing at the same version)"
    )


def _torch_nccl():
    try:
        return torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - a torch without NCCL (CPU builds): nothing to compare
        return None


if C.compiled_with_cuda():
    _mismatch = nccl_mismatch(C.nccl_version(), _torch_nccl())
    if _mismatch:
        raise ImportError(_mismatch)


# The reduction ops of the collectives (the compiled core parses the same names).
REDUCE_OPS = ("sum", "average", "min", "max", "prod", "band", "bor", "bxor")
# The linear ops that gradients are reduced with (DistributedOptimizer, allreduce_gradients,
# the differentiable allreduce), with torch's and NumPy's spellings of the average.
GRADIENT_OPS = {"sum": "sum", "average": "average", "avg": "average", "mean": "average"}


def gradient_op_error(call: str, op) -> str:
    """ "" when ``op`` is one of GRADIENT_OPS, else the message that names every accepted one.

    >>> gradient_op_error("allreduce_gradients", "sum")
    ''
    >>> gradient_op_error("allreduce_gradients", "median")
    "allreduce_gradients(op='median'): expected one of 'sum', 'average', 'avg', 'mean' ('avg' and 'mean' are 'average')"
    """
    if isinstance(op, str) and op in GRADIENT_OPS:
        return ""
    names = ", ".join(repr(o) for o in GRADIENT_OPS)
    return f"{call}(op={op!r}): expected one of {names} ('avg' and 'mean' are 'average')"


ROOT_LIMIT = 1 << 63
"""The compiled calls take a root as a C++ int64: one outside it is refused here, as a rank
that cannot exist, rather than by the binding's own text."""


def parse_root(root_rank) -> tuple[int, str]:
    """``(root, "")`` for an int-like ``root_rank``; else ``(0, message)``. Callers fold the
    message into the call's agreement, so that every rank raises it and none waits alone."""
    try:
        root = operator.index(root_rank)
    except TypeError:
        return 0, f"root_rank must be an int, got {root_rank!r} ({type(root_rank).__name__})"
    if not -ROOT_LIMIT <= root < ROOT_LIMIT:
        return 0, f"root_rank must be a rank (0 <= root_rank < world size), got {root}"
    return root, ""
