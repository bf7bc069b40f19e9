"""Stall reports and the job timeout, Python half (the protocol is csrc/runtime/stall_watch).

``settings`` turns Init's arguments and the environment (``FLUXMPI_STALL_WARNING``,
``FLUXMPI_TIMEOUT``) into seconds; ``start_stack_thread`` starts the thread that answers the
watchdog's requests for this rank's Python stack (the main thread's, as faulthandler takes it).
"""

from __future__ import annotations

import math
import os
import sys
import threading
import traceback
from typing import Any

import torch

from .._core import C

DEFAULT_STALL_WARNING = 60.0  # seconds, as Horovod's stall inspector
DEFAULT_TIMEOUT = 1800.0  # seconds, as torch.distributed
# Frames in these directories are not the user's line ("issued at").
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # fluxmpi_py/
_LIBRARY_DIRS = (
    _PACKAGE_DIR + os.sep,
    os.path.dirname(os.path.abspath(torch.__file__ or "")) + os.sep,
)
_OFF = ("", "0", "none", "off", "never", "inf")


class _Default:
    """The type of :data:`DEFAULT`: a default that an argument of ``Init`` reads as "not
    given" (the environment's value, else the built-in one), apart from every value a caller
    can pass (``None`` already means "off")."""

    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT: Any = _Default()  # Any: it stands in for an argument of any type
"""Init's default for ``stall_warning``, ``timeout`` and ``flight_dir``: the environment's
setting (``FLUXMPI_STALL_WARNING``, ``FLUXMPI_TIMEOUT``, ``FLUXMPI_FLIGHT_DIR``), else the
built-in one; on a second ``Init`` call, the value in force is kept."""
_UNSET = DEFAULT
_thread: threading.Thread | None = None


def _seconds(value, name: str, source: str) -> float:
    """Seconds from an argument or an environment variable; 0 means disabled.

    >>> _seconds("2.5", "timeout", "FLUXMPI_TIMEOUT"), _seconds("none", "timeout", "x")
    (2.5, 0.0)
    """
    if value is None or (isinstance(value, str) and value.strip().lower() in _OFF):
        return 0.0
    try:
        s = float(value)
    except (TypeError, ValueError):
        raise ValueError(
            f"{source}: {name} must be a number of seconds or None, got {value!r}"
        ) from None
    if math.isnan(s) or s < 0:
        raise ValueError(f"{source}: {name} must be >= 0 seconds or None, got {value!r}")
    return 0.0 if math.isinf(s) else s


def settings(stall_warning=_UNSET, timeout=_UNSET) -> tuple[float, float]:
    """(stall_warning, timeout) in seconds, 0 for disabled: Init's arguments where given, else
    ``FLUXMPI_STALL_WARNING`` / ``FLUXMPI_TIMEOUT``, else 60 s and 1800 s.

    >>> settings(stall_warning=2, timeout=None)
    (2.0, 0.0)
    """
    out = []
    for value, name, env, default in (
        (stall_warning, "stall_warning", "FLUXMPI_STALL_WARNING", DEFAULT_STALL_WARNING),
        (timeout, "timeout", "FLUXMPI_TIMEOUT", DEFAULT_TIMEOUT),
    ):
        if value is not _UNSET:
            out.append(_seconds(value, name, f"Init({name}=...)"))
        elif env in os.environ:
            out.append(_seconds(os.environ[env], name, env))
        else:
            out.append(default)
    return out[0], out[1]


def _site(frames: list[traceback.FrameSummary]) -> str:
    """The innermost frame outside fluxmpi_py and torch (the user's line), as
    'file:line in function'."""
    for f in reversed(frames):
        if not os.path.abspath(f.filename).startswith(_LIBRARY_DIRS):
            return f"{f.filename}:{f.lineno} in {f.name}"
    return ""


def main_thread_stack(limit: int = 16) -> tuple[str, str]:
    """The main thread's Python stack (innermost `limit` frames) and its user site.

    >>> stack, site = main_thread_stack(); "File" in stack
    True
    """
    ident = threading.main_thread().ident
    frame = sys._current_frames().get(ident) if ident is not None else None
    if frame is None:
        return "", ""
    frames = traceback.extract_stack(frame, limit=limit)
    return "".join(traceback.format_list(frames)).rstrip("\n"), _site(frames)


def _answer_stack_requests() -> None:
    while C.wait_stack_request():
        try:
            stack, site = main_thread_stack()
        except Exception as e:  # a report without a stack beats a dead thread
            stack, site = f"(the stack could not be taken: {e!r})", ""
        C.post_stack(stack, site)


def join_stack_thread(timeout: float) -> None:
    """Wait up to `timeout` seconds for the stack thread to end (after C.shutdown() woke it).

    >>> join_stack_thread(0.0)  # no thread: returns at once
    """
    if _thread is not None:
        _thread.join(timeout)


def start_stack_thread() -> None:
    """Start the daemon thread that answers the watchdog's stack requests (once)."""
    global _thread
    if _thread is None:
        _thread = threading.Thread(
            target=_answer_stack_requests, name="fluxmpi-stall-stack", daemon=True
        )
        _thread.start()
