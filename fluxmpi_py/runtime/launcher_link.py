"""A rank's line to ``python -m fluxmpi_py.run`` (fluxmpi_py/run.py), when that launcher started it.

The launcher listens on a TCP port and hands its address to the ranks in ``FLUXMPI_RUN_ADDRESS``
(``host:port``). At ``Init`` each rank connects once, says who it is in one line of JSON, and
keeps the connection open until its process ends. The launcher learns from that connection
alone what it needs: an end of stream is a rank that exited; a connection that the kernel's
TCP keepalive declares dead is a rank whose host, or the link to it, is lost. Nothing else
travels on it while the rank trains, so it pays nothing; as its process exits, the rank writes
one more line, ``exit N``, its exit status (csrc/runtime/exit_report.h: none where a signal or
``os._exit`` ended it). In the shrink mode the survivors of a loss write ``excluded PID START``
for each lost process that may still run (one hung alone on its host), and the launcher writes
``excluded`` to that rank, whose own thread ends it (csrc/runtime/launcher_notice.h).
"""

from __future__ import annotations

import json
import os
import socket
import warnings

ADDRESS_ENV = "FLUXMPI_RUN_ADDRESS"
CONNECT_TIMEOUT_S = 5.0

_connection: int | None = None  # the connection's file descriptor


def process_start(pid: int) -> int:
    """When process `pid` started, in clock ticks after boot (/proc/PID/stat's 22nd field), or 0
    where it cannot be read: with the pid, it names one process, not a later one of that pid.

    >>> process_start(os.getpid()) > 0 or not os.path.exists("/proc/self/stat")
    True
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()  # the name may hold spaces
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return 0


def hello(rank: int, size: int) -> bytes:
    """The line a rank sends first: its rank, the world size, its host, its process id and
    that process's start (process_start).

    >>> json.loads(hello(1, 4))["rank"]
    1
    """
    me = {"rank": rank, "size": size, "host": socket.gethostname(), "pid": os.getpid()}
    me["start"] = process_start(os.getpid())
    return (json.dumps(me) + "\n").encode()


def parse_address(text: str) -> tuple[str, int]:
    """``host:port`` as a (host, port) pair; the host may be a name or an IPv4 address.

    >>> parse_address("head:4711")
    ('head', 4711)
    """
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{ADDRESS_ENV} must be host:port, got {text!r}")
    return host, int(port)


def connect(rank: int, size: int) -> int | None:
    """Connect this rank to the launcher named by ``FLUXMPI_RUN_ADDRESS`` (nothing when it is
    unset, or after the first call); the connection's descriptor, or None. A launcher that
    cannot be reached is a warning: the job runs on, and only the launcher's watch over lost
    hosts is missing.

    >>> connect(0, 1) is None  # no FLUXMPI_RUN_ADDRESS here: nothing to do
    True
    """
    global _connection
    text = os.environ.get(ADDRESS_ENV)
    if not text or _connection is not None:
        return None
    try:
        host, port = parse_address(text)
        conn = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
        conn.sendall(hello(rank, size))
    except (OSError, ValueError) as e:
        warnings.warn(
            f"fluxmpi_py: rank {rank} on {socket.gethostname()} cannot reach the launcher at "
            f"{text} ({ADDRESS_ENV}): {e}; the launcher will not see this rank exit",
            stacklevel=3,
        )
        return None
    # Held open, unread, until the process ends: its end is the message. The bare descriptor,
    # so that no garbage collection at interpreter exit closes it before the process is gone.
    _connection = conn.detach()
    return _connection


def parse_excluded(tail: bytes) -> list[tuple[int, int]]:
    r"""The processes (pid, start) that a survivor told the launcher it excluded (csrc's
    runtime/launcher_notice.h: ``excluded PID START``), in what it sent after its first line.

    >>> parse_excluded(b"excluded 41 7\nexit 0\n")
    [(41, 7)]
    """
    found = []
    for line in tail.splitlines():
        words = line.decode(errors="replace").split()
        if len(words) == 3 and words[0] == "excluded" and all(w.isdigit() for w in words[1:]):
            found.append((int(words[1]), int(words[2])))
    return found


def parse_exit(tail: bytes) -> int | None:
    r"""The exit status a rank reported in what it sent after its first line, or None.

    >>> parse_exit(b"exit 3\n"), parse_exit(b"")
    (3, None)
    """
    for line in reversed(tail.splitlines()):
        word, _, number = line.decode(errors="replace").partition(" ")
        if word == "exit" and number.lstrip("-").isdigit():
            return int(number)
    return None


def _forget_in_child() -> None:
    """In a forked child (a DataLoader worker): close the copy of the connection, which would
    otherwise keep it open after the rank itself exited, hiding the rank's end."""
    global _connection
    if _connection is not None:
        try:
            os.close(_connection)
        except OSError:
            pass
        _connection = None


os.register_at_fork(after_in_child=_forget_in_child)
