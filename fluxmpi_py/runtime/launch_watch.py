"""The launcher's watch over the ranks (``python -m fluxmpi_py.run``, fluxmpi_py/run.py): what it
knows of each rank from its connection (runtime/launcher_link.py is the rank's side), what it
does with a rank that the survivors excluded, and how it words the end of an attempt: mpiexec's
own ending, the launcher's verdict when mpiexec outlived every rank, and under ``--elastic`` the
ranks lost while the job went on.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass

from .launcher_link import process_start
from .stop import REQUEUE_STATUS

LOST_STATUS = 1  # the launcher's status when it had to end mpiexec


@dataclass
class Rank:
    rank: int = -1
    size: int = 0
    host: str = "?"
    pid: int = 0
    start: int = 0  # its process's start (launcher_link.process_start), 0 where unknown
    conn: socket.socket | None = None  # the launcher's end of its line
    buffer: bytes = b""
    ended: bool = False  # its process exited (end of stream)
    lost: str = ""  # why its connection is dead, when it is
    gone_at: int = -1  # the launcher's select round in which it was seen to exit or be lost
    gone_s: float = -1.0  # seconds after the launch when it was
    status: int | None = None  # the exit status it reported as it exited (none: killed, lost)
    excluded_s: float = -1.0  # when the survivors said they excluded it while it still ran


def newly_excluded(ranks: list[Rank], told: list[tuple[int, int]], now_s: float) -> list[Rank]:
    """The ranks still connected whose process (pid, start) the survivors `told` the launcher
    they excluded, not named before; each is marked excluded (and gone) at `now_s`.

    >>> ranks = [Rank(rank=0, pid=40, start=7), Rank(rank=1, pid=41, start=7)]
    >>> [r.rank for r in newly_excluded(ranks, [(41, 7), (41, 7)], 3.0)], ranks[1].excluded_s
    ([1], 3.0)
    """
    found = []
    for pid, start in told:
        for r in ranks:
            if (r.pid, r.start) == (pid, start) and r.excluded_s < 0 and not (r.ended or r.lost):
                r.excluded_s = r.gone_s = now_s
                found.append(r)
    return found


def end_excluded(r: Rank) -> str:
    """End rank `r`, which the survivors excluded while it still ran (hung: stopped, stuck):
    tell it on its line (its own thread ends it, if it runs at all), and where it runs on this
    host as the very process that connected (pid and start), SIGKILL it. The launcher's words.
    """
    if r.conn is not None:
        try:
            r.conn.send(b"excluded\n")
        except OSError:
            pass
    who = f"rank {r.rank} (pid {r.pid} on {r.host})"
    said = f"fluxmpi_py.run: excluded by the survivors: {who}, which still ran at {r.gone_s:.1f} s"
    here = r.host == socket.gethostname() and r.start and process_start(r.pid) == r.start
    if here:
        try:
            os.kill(r.pid, signal.SIGKILL)
            return said + "; ended it (SIGKILL)"
        except OSError:
            pass
    return (
        said + "; told it to end. Where it cannot (stopped), it ends with mpiexec, which "
        "this launcher ends once the survivors have exited (on another host it is out of reach)"
    )


def ranks_text(ranks: list[int]) -> str:
    """'rank 3' or 'ranks 2, 3'.

    >>> ranks_text([2, 3])
    'ranks 2, 3'
    """
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, sorted(ranks)))


def keepalive(conn: socket.socket, seconds: float) -> None:
    """Declare `conn` dead after about `seconds` without an answer from its peer's kernel."""
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    probes = 3
    interval = max(1, int(seconds / (probes + 1)))
    for name, value in (
        ("TCP_KEEPIDLE", interval),
        ("TCP_KEEPINTVL", interval),
        ("TCP_KEEPCNT", probes),
        ("TCP_USER_TIMEOUT", int(seconds * 1000)),
    ):
        if hasattr(socket, name):  # Linux names; elsewhere the system's keepalive applies
            conn.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def verdict(ranks: list[Rank], grace_s: float, elastic: bool = False) -> tuple[int, str]:
    """Why the launcher ended mpiexec, in words that name the lost hosts and ranks, and the
    status to return: LOST_STATUS, or under --elastic the survivors' 0 when every rank that
    reported its exit status reported 0 (the others were lost with their host, or killed).

    >>> a, b = Rank(rank=0, ended=True, status=0), Rank(rank=1, host="h1", lost="timed out")
    >>> verdict([a, b], 5, elastic=True)[0], verdict([a, b], 5)[0]
    (0, 1)
    """
    lost: dict[str, list[int]] = {}
    for r in ranks:
        if r.lost:
            lost.setdefault(r.host, []).append(r.rank)
    ended = [r.rank for r in ranks if r.ended]
    hung = [r.rank for r in ranks if r.excluded_s >= 0 and not (r.ended or r.lost)]
    parts = []
    for host, rs in sorted(lost.items()):
        parts.append(f"lost host {host} ({ranks_text(rs)}: no TCP answer from it)")
    if ended:
        parts.append(f"{ranks_text(ended)} exited")
    if hung:
        parts.append(f"{ranks_text(hung)} excluded by the survivors, still running")
    text = (
        "fluxmpi_py.run: "
        + "; ".join(parts)
        + f"; mpiexec had not ended {grace_s:g} s after that: ending it"
        + (" (Open MPI cannot abort a job on a host it cannot reach)" if lost else "")
        + (" (it waits for every process; its daemons end the excluded ones)" if hung else "")
    )
    told = [r for r in ranks if r.status is not None]
    if elastic and told and all(r.status == 0 for r in told):
        who = ranks_text([r.rank for r in told])
        return 0, text + f"; --elastic: the survivors ({who}) exited 0, and so does the job"
    return LOST_STATUS, text


@dataclass
class Outcome:
    """How one launch of mpiexec ended."""

    status: int  # the exit status to report: mpiexec's, 128 + N for signal N
    how: str  # what ended it, in words
    stopped: bool = False  # ended from outside (Ctrl-C, SIGTERM): not relaunched


def signal_name(number: int) -> str:
    """'SIGKILL' for 9.

    >>> signal_name(9)
    'SIGKILL'
    """
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


LOST_BEFORE_S = 2.0  # --elastic, where no rank told its status: gone this long before the last


def lost_ranks(ranks: list[Rank]) -> list[Rank]:
    """--elastic: the ranks that went (died, were lost, failed) while the others trained on.
    Those are, where some rank exited 0 and told the launcher so, every other rank; where none
    told, the ranks gone LOST_BEFORE_S before the last one.

    >>> ranks = [Rank(rank=0, gone_s=9, status=0), Rank(rank=1, gone_s=8.5), Rank(rank=2, gone_s=9)]
    >>> [r.rank for r in lost_ranks(ranks)]  # rank 0 told 0; 1 was killed, 2 said nothing
    [1, 2]
    """
    gone = [r for r in ranks if r.rank >= 0 and r.gone_s >= 0]
    if any(r.status == 0 for r in gone):
        lost = [r for r in gone if r.status != 0]
    else:
        last = max((r.gone_s for r in gone), default=0.0)
        lost = [r for r in gone if r.gone_s < last - LOST_BEFORE_S]
    return sorted(lost, key=lambda r: (r.gone_s, r.rank))


def report_lost(ranks: list[Rank]) -> None:
    """--elastic: name the ranks that went while the others trained on (lost_ranks)."""
    lost = lost_ranks(ranks)
    if lost:
        who = "; ".join(
            f"rank {r.rank} (pid {r.pid} on {r.host}) at {r.gone_s:.1f} s"
            + (f", exit status {r.status}" if r.status is not None else "")
            for r in lost
        )
        print(f"fluxmpi_py.run: lost while the job went on: {who}", file=sys.stderr, flush=True)


def ended_by(proc: subprocess.Popen, ranks: list[Rank]) -> Outcome:
    """mpiexec's ending in words, naming the ranks the launcher saw exit first."""
    code = proc.returncode
    if code < 0:
        name = signal_name(-code)
        stopped = -code in (signal.SIGINT, signal.SIGTERM)
        return Outcome(128 - code, f"mpiexec was ended by {name}", stopped)
    if code == REQUEUE_STATUS:
        return Outcome(code, f"the ranks stopped to be requeued (exit status {code})", True)
    how = f"exit status {code}"
    if 128 < code < 128 + 65:
        how += f" (128 + {signal_name(code - 128)})"
    gone = [r for r in ranks if r.rank >= 0 and r.gone_at >= 0]
    if code and gone:
        first = min(r.gone_at for r in gone)
        seen = sorted((r for r in gone if r.gone_at == first), key=lambda r: r.rank)
        who = ", ".join(f"rank {r.rank} (pid {r.pid} on {r.host})" for r in seen)
        how += f"; first seen to exit: {who}"
    return Outcome(code, how)
