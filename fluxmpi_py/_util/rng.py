"""This process's random number generator states, for checkpoints that resume exactly:
torch's CPU generator, CUDA's (when CUDA has been initialized), numpy's global one (when numpy
is importable) and Python's ``random``. The captured state holds only tensors, numbers, strings
and tuples, so it loads with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import random
from typing import Any

import torch


def _numpy():
    try:
        import numpy
    except ImportError:
        return None
    return numpy


def capture() -> dict[str, Any]:
    """This process's generator states.

    >>> {"torch", "python"} <= set(capture())
    True
    """
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    np = _numpy()
    if np is not None:
        kind, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
        state["numpy"] = (str(kind), torch.from_numpy(keys.astype("int64")), int(pos),
                          int(has_gauss), float(gauss))  # fmt: skip
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


# The torch CPU generator's state that the last restore() put back, until a resumed
# container's or sampler's loader draw is put back (undo_one_draw).
_resume_point: list[torch.Tensor | None] = [None]


def _one_draw_past() -> tuple[torch.Generator, int] | None:
    """A generator at the state the last ``restore()`` set, after one DataLoader base-seed draw
    (one int64), and that draw; None when nothing was restored (or it was taken)."""
    point = _resume_point[0]
    if point is None:
        return None
    g = torch.Generator()
    g.set_state(point)
    return g, int(torch.empty((), dtype=torch.int64).random_(generator=g))


def undo_one_draw() -> bool:
    """Where torch's CPU generator stands exactly one DataLoader base-seed draw (one int64)
    past the state the last ``restore()`` set, put it back there, once, and return True; else
    change nothing and return False. A DataLoader built without ``generator=`` draws its base
    seed from that generator each time it is iterated, and a resumed run iterates once more
    than an uninterrupted one (the new loader over the rest of the epoch): undone at the
    resumed container's or sampler's first touch, so dropout draws the same numbers.

    >>> s = capture(); restore(s); _ = torch.empty((), dtype=torch.int64).random_()
    >>> undo_one_draw(), torch.equal(torch.get_rng_state(), s["torch"]), undo_one_draw()
    (True, True, False)
    """
    point, past = _resume_point[0], _one_draw_past()
    if point is None or past is None or not torch.equal(past[0].get_state(), torch.get_rng_state()):
        return False
    _resume_point[0] = None
    torch.set_rng_state(point)
    return True


def drew_resume_point(seed: int) -> bool:
    """Whether ``seed`` is the first int64 that torch's CPU generator gives from the state the
    last ``restore()`` set: in a DataLoader worker, ``get_worker_info().seed - id`` is the
    base seed its loader drew, and this says that the loader drew it from the global generator
    (it has no ``generator=`` of its own). False when nothing was restored.

    >>> s = capture(); restore(s); first = int(torch.empty((), dtype=torch.int64).random_())
    >>> drew_resume_point(first), drew_resume_point(first + 1)
    (True, False)
    """
    past = _one_draw_past()
    return past is not None and past[1] == seed


def restore(state: dict[str, Any]) -> None:
    """Put back the generator states of ``capture()``. A state for numpy without numpy, or for
    another number of CUDA devices, raises ValueError.

    >>> s = capture(); a = torch.rand(2); restore(s); torch.equal(a, torch.rand(2))
    True
    """
    torch.set_rng_state(state["torch"])
    _resume_point[0] = state["torch"].clone()
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "numpy" in state:
        np = _numpy()
        if np is None:
            raise ValueError(
                "the checkpoint holds numpy's random state, but numpy is not installed"
            )
        kind, keys, pos, has_gauss, gauss = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype("uint32"), pos, has_gauss, gauss))
    if "cuda" in state:
        states = state["cuda"]
        if not torch.cuda.is_available() or torch.cuda.device_count() != len(states):
            have = torch.cuda.device_count() if torch.cuda.is_available() else 0
            raise ValueError(
                f"the checkpoint holds the random state of {len(states)} CUDA devices, "
                f"this process sees {have}"
            )
        torch.cuda.set_rng_state_all(states)
