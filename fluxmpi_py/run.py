"""``python -m fluxmpi_py.run [options] MPIEXEC-ARGS... train.py [args]``: mpiexec, made to end.

Runs ``mpiexec MPIEXEC-ARGS... train.py [args]`` and returns its exit status, with one
difference: a job that lost a host still ends. Open MPI's abort needs every host's daemon; when a
host or its link is lost, ``mpiexec`` hangs ("abort is already in progress") long after every
rank it can reach has exited. This launcher hands the ranks its address
(``FLUXMPI_RUN_ADDRESS``, fluxmpi_py/runtime/launcher_link.py); each rank connects at ``Init`` and
keeps the connection open. A connection that ends is a rank that exited; one that TCP keepalive
declares dead is a rank whose host is lost. Once every rank has exited or been lost, and
``mpiexec`` has still not ended ``--grace`` seconds later, the launcher ends it (SIGTERM, then
SIGKILL to its process group) and returns 1, naming the lost hosts and their ranks.

Options (before the mpiexec arguments; everything else goes to mpiexec unchanged):
    --mpiexec PATH     the mpiexec to run (default: mpiexec)
    --address HOST     the name or address ranks reach this machine by (default: its hostname)
    --grace SECONDS    how long mpiexec may outlive the ranks (default 5)
    --keepalive SECONDS  a rank's host is lost after this long without a TCP answer (default 5)

A job whose ranks never call ``fluxmpi_py.Init`` runs as under plain ``mpiexec``.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import cast

from .runtime.launcher_link import ADDRESS_ENV

__all__ = ["RunOptions", "parse_args", "run_job"]

LOST_STATUS = 1  # the launcher's status when it had to end mpiexec
_KILL_WAIT_S = 3.0  # SIGTERM to SIGKILL


@dataclass
class RunOptions:
    """The launcher's own options; ``mpiexec_args`` is the rest of the command line.

    >>> RunOptions(mpiexec_args=["-n", "2", "train.py"]).grace_s
    5.0
    """

    mpiexec_args: list[str] = field(default_factory=list)
    mpiexec: str = "mpiexec"
    address: str = ""
    grace_s: float = 5.0
    keepalive_s: float = 5.0


_VALUED = {"--mpiexec": "mpiexec", "--address": "address"}
_SECONDS = {"--grace": "grace_s", "--keepalive": "keepalive_s"}


def _sock(key: selectors.SelectorKey) -> socket.socket:
    """The socket a selector key was registered with (only sockets are registered here)."""
    return cast(socket.socket, key.fileobj)


def parse_args(argv: list[str]) -> RunOptions:
    """The leading launcher options of `argv`; the first other word starts mpiexec's arguments.

    >>> o = parse_args(["--grace", "2", "-n", "4", "python", "train.py"])
    >>> o.grace_s, o.mpiexec_args
    (2.0, ['-n', '4', 'python', 'train.py'])
    """
    opts = RunOptions()
    i = 0
    while i < len(argv) and (argv[i] in _VALUED or argv[i] in _SECONDS):
        flag = argv[i]
        if i + 1 >= len(argv):
            raise SystemExit(f"fluxmpi_py.run: {flag} needs a value")
        value = argv[i + 1]
        if flag in _SECONDS:
            try:
                seconds = float(value)
            except ValueError:
                seconds = -1.0
            if not seconds > 0:
                raise SystemExit(f"fluxmpi_py.run: {flag} must be seconds > 0, got {value!r}")
            setattr(opts, _SECONDS[flag], seconds)
        else:
            setattr(opts, _VALUED[flag], value)
        i += 2
    opts.mpiexec_args = list(argv[i:])
    if not opts.mpiexec_args:
        raise SystemExit(__doc__.split("\n\n")[0])
    return opts


@dataclass
class _Rank:
    rank: int = -1
    size: int = 0
    host: str = "?"
    pid: int = 0
    buffer: bytes = b""
    ended: bool = False  # its process exited (end of stream)
    lost: str = ""  # why its connection is dead, when it is


def _ranks_text(ranks: list[int]) -> str:
    """'rank 3' or 'ranks 2, 3'.

    >>> _ranks_text([2, 3])
    'ranks 2, 3'
    """
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, sorted(ranks)))


def _keepalive(conn: socket.socket, seconds: float) -> None:
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


def _is_open_mpi(mpiexec: str) -> bool:
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "Open MPI" in out.stdout or "OpenRTE" in out.stdout


def _end(proc: subprocess.Popen) -> None:
    """SIGTERM to mpiexec's process group, SIGKILL after a moment; then reap it."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(_KILL_WAIT_S)
            break
        except subprocess.TimeoutExpired:
            continue
    proc.wait()


def _verdict(ranks: list[_Rank], grace_s: float) -> str:
    """Why the launcher ended mpiexec, in words that name the lost hosts and ranks."""
    lost: dict[str, list[int]] = {}
    for r in ranks:
        if r.lost:
            lost.setdefault(r.host, []).append(r.rank)
    ended = [r.rank for r in ranks if r.ended]
    parts = []
    for host, rs in sorted(lost.items()):
        parts.append(f"lost host {host} ({_ranks_text(rs)}: no TCP answer from it)")
    if ended:
        parts.append(f"{_ranks_text(ended)} exited")
    return (
        "fluxmpi_py.run: "
        + "; ".join(parts)
        + f"; mpiexec had not ended {grace_s:g} s after that: ending it"
        + (" (Open MPI cannot abort a job on a host it cannot reach)" if lost else "")
    )


def run_job(opts: RunOptions) -> int:
    """Run mpiexec once, watching the ranks; its exit status, or LOST_STATUS when the launcher
    had to end it. Ctrl-C ends the whole job.

    >>> run_job(RunOptions(mpiexec_args=["-n", "1", sys.executable, "-c", "pass"]))  # doctest: +SKIP
    0
    """
    listener = socket.create_server(("", 0), backlog=256)
    port = listener.getsockname()[1]
    address = f"{opts.address or socket.gethostname()}:{port}"
    env = dict(os.environ, **{ADDRESS_ENV: address})
    cmd = [opts.mpiexec]
    if _is_open_mpi(opts.mpiexec):
        cmd += ["-x", ADDRESS_ENV]  # Open MPI passes on only the variables it is told to
    cmd += opts.mpiexec_args
    sel = selectors.DefaultSelector()
    listener.setblocking(False)
    sel.register(listener, selectors.EVENT_READ, None)
    ranks: list[_Rank] = []
    done_since = None  # when every rank seen had exited or been lost
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        while proc.poll() is None:
            for key, _ in sel.select(timeout=0.25):
                if key.data is None:
                    conn, _ = listener.accept()
                    conn.setblocking(False)
                    _keepalive(conn, opts.keepalive_s)
                    ranks.append(_Rank())
                    sel.register(conn, selectors.EVENT_READ, ranks[-1])
                    continue
                r: _Rank = key.data
                try:
                    data = _sock(key).recv(4096)
                except BlockingIOError:
                    continue
                except OSError as e:  # ETIMEDOUT from keepalive, EHOSTUNREACH: the host is gone
                    r.lost = e.strerror or str(e)
                    data = None
                if data:
                    r.buffer += data
                    line, sep, _ = r.buffer.partition(b"\n")
                    if sep and r.rank < 0:
                        try:
                            me = json.loads(line)
                            r.rank, r.size = int(me["rank"]), int(me["size"])
                            r.host, r.pid = str(me["host"]), int(me["pid"])
                        except (ValueError, KeyError, TypeError):
                            pass
                    continue
                r.ended = not r.lost
                sel.unregister(key.fileobj)
                _sock(key).close()
            # Judged once every rank of the world has connected (a rank that dies before it
            # connects ends the job the ordinary way): all of them exited or lost.
            size = max((r.size for r in ranks), default=0)
            known = sum(r.rank >= 0 for r in ranks)
            if size and known >= size and all(r.ended or r.lost for r in ranks):
                done_since = done_since or time.monotonic()
                if time.monotonic() - done_since >= opts.grace_s:
                    print(_verdict(ranks, opts.grace_s), file=sys.stderr, flush=True)
                    _end(proc)
                    return LOST_STATUS
            else:
                done_since = None
        return proc.returncode
    except KeyboardInterrupt:
        _end(proc)
        return 130
    finally:
        if proc.poll() is None:
            _end(proc)
        for key in list(sel.get_map().values()):
            _sock(key).close()
        sel.close()


def main(argv: list[str] | None = None) -> int:
    """The command line: ``python -m fluxmpi_py.run [options] MPIEXEC-ARGS...``."""
    return run_job(parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
