"""Import the compiled core with a message that says how to fix a broken install."""
import torch  # noqa: F401  (loads libtorch before our extension)

try:
    from . import _C  # noqa: F401
except ImportError as e:  # pragma: no cover - only on broken installs
    raise ImportError(
        f"fluxmpi_py's compiled core failed to load ({e}). Rebuild it against the torch in this "
        f"environment (torch {torch.__version__}) with: pip install --no-build-isolation ."
    ) from e

C = _C
