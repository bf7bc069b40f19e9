"""The flight recorder, Python half (the ring and its dump are csrc/runtime/flight).

Every rank keeps its last ``FLUXMPI_FLIGHT_SIZE`` blocking collectives (default 256; 0 turns
the recorder off) in a ring. ``settings`` turns Init's ``flight_dir=`` and the environment
(``FLUXMPI_FLIGHT_DIR``, ``FLUXMPI_FLIGHT_SIZE``, ``FLUXMPI_TIMELINE``) into values; ``apply``
hands them to the C++ side after ``C.init``. With a directory, each rank writes
``fluxmpi_flight.<rank>.json`` there on the stall timeout, an abort or SIGTERM/SIGINT
(``python -m fluxmpi_py.flight DIR`` reads them). ``FLUXMPI_TIMELINE=path`` writes the same
records as a Chrome trace (chrome://tracing, Perfetto) at exit, one file per rank.
"""

from __future__ import annotations

import json
import os

from .._core import C
from .._util.files import write_atomic
from .stall import DEFAULT

DEFAULT_SLOTS = 256
_UNSET = DEFAULT
# The fields of C.flight_records()'s tuples, in order.
FIELDS = ("seq", "group", "number", "kind", "call", "bytes", "enter_us", "start_us", "end_us")


def settings(flight_dir=_UNSET) -> tuple[str, int, str]:
    """(directory, slots, timeline path): Init's ``flight_dir=`` where given, else
    ``FLUXMPI_FLIGHT_DIR``; ``FLUXMPI_FLIGHT_SIZE`` (default 256); ``FLUXMPI_TIMELINE``.
    "" stands for none.

    >>> settings(flight_dir="/tmp/f")[0]
    '/tmp/f'
    """
    if flight_dir is _UNSET or flight_dir is None:
        directory = os.environ.get("FLUXMPI_FLIGHT_DIR", "") if flight_dir is _UNSET else ""
    elif isinstance(flight_dir, (str, os.PathLike)):
        directory = os.fspath(flight_dir)
    else:
        raise TypeError(
            f"Init(flight_dir=...) takes a directory path or None, got {type(flight_dir).__name__}"
        )
    raw = os.environ.get("FLUXMPI_FLIGHT_SIZE", "").strip()
    try:
        slots = int(raw) if raw else DEFAULT_SLOTS
    except ValueError:
        slots = -1
    if slots < 0:
        raise ValueError(
            f"FLUXMPI_FLIGHT_SIZE: expected a number of calls >= 0 (0 turns the recorder off), "
            f"got {raw!r}"
        )
    return directory, slots, os.environ.get("FLUXMPI_TIMELINE", "")


def apply(directory: str, slots: int) -> None:
    """Size the ring and name the dump directory (made if missing); after ``C.init``."""
    if slots != C.flight_capacity():
        C.set_flight_capacity(slots)
    if directory:
        os.makedirs(directory, exist_ok=True)
        directory = os.path.abspath(directory)
    C.set_flight_dir(directory)


def records() -> list[dict]:
    """This rank's records, oldest first, as dicts (``FIELDS``; ``end_us`` None while in
    flight)."""
    return [dict(zip(FIELDS, r)) for r in C.flight_records()]


def timeline_path(path: str, rank: int) -> str:
    """Where rank ``rank`` writes its timeline: ``{rank}`` in ``path`` replaced, else the rank
    before the suffix.

    >>> timeline_path("trace.json", 1), timeline_path("t/{rank}.json", 0)
    ('trace.1.json', 't/0.json')
    """
    if "{rank}" in path:
        return path.replace("{rank}", str(rank))
    head, ext = os.path.splitext(path)
    return f"{head}.{rank}{ext or '.json'}"


def trace_events(recs: list[dict], rank: int) -> list[dict]:
    """Chrome trace events for one rank's records: one complete event ("X") per collective,
    on process ``rank``, thread ``group`` (0: the world); a call still in flight ends now.

    >>> ev = trace_events([dict(zip(FIELDS, (1, 0, 1, "allreduce", "allreduce_()", 8,
    ...                                       10, 12, 20)))], rank=1)
    >>> ev[-1]["name"], ev[-1]["ts"], ev[-1]["dur"], ev[-1]["pid"]
    ('allreduce', 12, 8, 1)
    """
    events: list[dict] = [
        {"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}}
    ]
    for r in recs:
        end = r["end_us"]
        args = {k: r[k] for k in ("number", "group", "call", "bytes")}
        args["since_call_began_us"] = r["start_us"] - r["enter_us"]
        if end is None:
            args["in_flight"] = True
        events.append(
            {
                "name": r["kind"],
                "cat": "collective",
                "ph": "X",
                "ts": r["start_us"],
                "dur": max(0, (end if end is not None else r["start_us"]) - r["start_us"]),
                "pid": rank,
                "tid": r["group"],
                "args": args,
            }
        )
    return events


def write_timeline(path: str) -> str:
    """Write this rank's records as a Chrome trace to ``timeline_path(path, rank)``; returns
    that path."""
    out = timeline_path(path, C.rank())
    doc = {"traceEvents": trace_events(records(), C.rank()), "displayTimeUnit": "ms"}
    write_atomic(out, json.dumps(doc).encode())
    return out
