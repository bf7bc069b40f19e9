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

Restarts: with ``--max-restarts K``, a job that fails (any non-zero status, a lost host
included) is launched again, at once, up to K times; each relaunch is announced on stderr with
the status and what ended the attempt. The script reads its attempt number from
``FLUXMPI_RESTART`` (0, then 1, ...) and resumes from ``fluxmpi_py.latest_checkpoint(dir)``.
A job stopped from outside (Ctrl-C or SIGTERM to the launcher, SIGINT or SIGTERM to mpiexec)
is not relaunched. The launcher returns the last attempt's status (128 + N for signal N).
SIGUSR1 to the launcher goes on to mpiexec, which passes it to every rank: a time limit's
warning, which the ranks turn into an agreed stop (``fluxmpi_py.stop_requested``); ranks that
then exit with ``fluxmpi_py.REQUEUE_STATUS`` (75) stopped to be requeued by the scheduler and
are not relaunched either.

Options (before the program; everything else goes to mpiexec unchanged):
    --mpiexec PATH     the mpiexec to run (default: the one beside the MPI library that
                       fluxmpi_py was built against, such as the venv's; else PATH's)
    --address HOST     the name or address ranks reach this machine by (default: its hostname)
    --grace SECONDS    how long mpiexec may outlive the ranks (default 5)
    --keepalive SECONDS  a rank's host is lost after this long without a TCP answer (default 5)
    --max-restarts K   relaunch a failed job up to K times (default 0)
    --elastic          the shrink mode: a lost rank costs a step, not the job. Passes Open MPI
                       what ULFM needs (--with-ft ulfm, --mca coll ^han,cuda, its failure
                       detector for cut links and hung ranks: --mca mpi_ft_detector true) and
                       FLUXMPI_ON_FAILURE=shrink to the ranks; the job goes on while ranks
                       remain, and its status is the survivors' (also when the launcher must end
                       an mpiexec that waits for a lost host: each rank tells the launcher its
                       exit status as it exits). Lost ranks are named at the end. A rank the
                       survivors excluded while it still ran (hung alone on its host) is told
                       to end, SIGKILLed when on this host, else ended with mpiexec once the
                       survivors have exited.

The options may come first, or among mpiexec's own options before the program when the
program is Python (``python``, ``python3.11``, a path to one) or a ``.py`` file:
``python -m fluxmpi_py.run -n 4 --max-restarts 2 python train.py``. After the program every
word is the program's own.

A job whose ranks never call ``fluxmpi_py.Init`` runs as under plain ``mpiexec``.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import cast

from ._util.mpiexec import default_mpiexec, remove_session_dir
from .runtime.launch_watch import (
    Outcome,
    Rank,
    end_excluded,
    ended_by,
    keepalive,
    newly_excluded,
    report_lost,
    verdict,
)
from .runtime.launcher_link import ADDRESS_ENV, parse_excluded, parse_exit

__all__ = ["RunOptions", "parse_args", "run_job", "run_with_restarts", "RESTART_ENV"]

RESTART_ENV = "FLUXMPI_RESTART"  # the attempt's number, 0 for the first launch
_KILL_WAIT_S = 3.0  # SIGTERM to SIGKILL
_RUNNING: list[subprocess.Popen] = []  # the mpiexec of the attempt in progress


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
    max_restarts: int = 0
    elastic: bool = False


_VALUED = {"--mpiexec": "mpiexec", "--address": "address"}
_SECONDS = {"--grace": "grace_s", "--keepalive": "keepalive_s"}
_COUNTS = {"--max-restarts": "max_restarts"}
_FLAGS = {"--elastic": "elastic"}
_OPTIONS = {**_VALUED, **_SECONDS, **_COUNTS, **_FLAGS}
# ULFM; the collective components that are not fault tolerant left out; Open MPI's detector of
# silent ranks (heartbeats every mpi_ft_detector_period = 3 s; a rank silent for
# mpi_ft_detector_timeout = 10 s is declared failed: a cut link, a hung rank), its verdicts
# spread among the ranks themselves (a reliable broadcast), not through mpiexec's daemons, which
# a cut link divides too. Not mpi_ft_detector_thread: with it, 5.0.11's ranks hung in
# MPI_Finalize and now and then crashed in their first MPI_Comm_dup; without it the heartbeats
# go out from MPI's progress, which the stall watch's thread drives once a second
# (docs/sections/78-lost-ranks.md)
ELASTIC_MPIEXEC_ARGS = [
    "--with-ft",
    "ulfm",
    "--mca",
    "coll",
    "^han,cuda",
    "--mca",
    "mpi_ft_detector",
    "true",
    "--mca",
    "mpi_ft_propagator_with_rbcast",
    "true",
]
ON_FAILURE_ENV = "FLUXMPI_ON_FAILURE"  # runtime/elastic.py's
_PYTHON = re.compile(r"python[0-9.]*")


def _is_python_program(word: str) -> bool:
    """Whether `word` starts the program: a Python interpreter or a .py file."""
    return word.endswith(".py") or _PYTHON.fullmatch(os.path.basename(word)) is not None


def _sock(key: selectors.SelectorKey) -> socket.socket:
    """The socket a selector key was registered with (only sockets are registered here)."""
    return cast(socket.socket, key.fileobj)


def _launcher_option_ends(argv: list[str]) -> int:
    """Where launcher options may stand in `argv`: before the Python program, when there is
    one (mpiexec's options may come between), else only at the start."""
    for i, word in enumerate(argv):
        if _is_python_program(word) and (i == 0 or argv[i - 1] not in _OPTIONS):
            return i
    return 0


def parse_args(argv: list[str]) -> RunOptions:
    """The launcher options of `argv` (see the module's docstring for where they may stand);
    the other words are mpiexec's arguments, in order.

    >>> o = parse_args(["--grace", "2", "-n", "4", "--max-restarts", "1", "python", "train.py"])
    >>> o.grace_s, o.max_restarts, o.mpiexec_args
    (2.0, 1, ['-n', '4', 'python', 'train.py'])
    """
    opts = RunOptions()
    ends = _launcher_option_ends(argv)
    rest: list[str] = []
    i = 0
    while i < len(argv):
        flag = argv[i]
        if flag not in _OPTIONS or (i >= ends and rest):
            rest.append(flag)
            i += 1
            continue
        if flag in _FLAGS:
            setattr(opts, _FLAGS[flag], True)
            i += 1
            continue
        if i + 1 >= len(argv):
            raise SystemExit(f"fluxmpi_py.run: {flag} needs a value")
        value = argv[i + 1]
        if flag in _COUNTS:
            if not re.fullmatch(r"[0-9]+", value):
                raise SystemExit(
                    f"fluxmpi_py.run: {flag} must be a whole number >= 0 (how many times to "
                    f"relaunch a failed job), got {value!r}"
                )
            setattr(opts, _COUNTS[flag], int(value))
        elif flag in _SECONDS:
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
    opts.mpiexec_args = rest
    if not opts.mpiexec_args:
        raise SystemExit(__doc__.split("\n\n")[0])
    return opts


def _mpiexec_of(opts: RunOptions) -> str:
    """The mpiexec to run: ``--mpiexec``'s, or by default the one beside the MPI library that
    fluxmpi_py loaded (this venv's Open MPI from PyPI), else PATH's."""
    return default_mpiexec() if opts.mpiexec == "mpiexec" else opts.mpiexec


def _is_open_mpi(mpiexec: str) -> bool:
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "Open MPI" in out.stdout or "OpenRTE" in out.stdout


def _end(proc: subprocess.Popen) -> None:
    """SIGTERM to mpiexec's process group, SIGKILL after a moment; then reap it, and remove
    the session directory a killed one leaves (a later mpiexec given its pid could not start)."""
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
    remove_session_dir(proc.pid)


class _Stopped(BaseException):
    """SIGTERM to the launcher: end the job, as Ctrl-C does (a scheduler's cancel)."""


def _launch(opts: RunOptions, restart: int) -> Outcome:
    """Run mpiexec once as attempt `restart`, watching the ranks."""
    listener = socket.create_server(("", 0), backlog=256)
    port = listener.getsockname()[1]
    address = f"{opts.address or socket.gethostname()}:{port}"
    env = dict(os.environ, **{ADDRESS_ENV: address, RESTART_ENV: str(restart)})
    mpiexec = _mpiexec_of(opts)
    cmd = [mpiexec]
    if _is_open_mpi(mpiexec):
        cmd += ["-x", ADDRESS_ENV, "-x", RESTART_ENV]  # Open MPI passes on only these
        if opts.elastic:
            cmd += [*ELASTIC_MPIEXEC_ARGS, "-x", ON_FAILURE_ENV]
    if opts.elastic:
        env[ON_FAILURE_ENV] = "shrink"
    cmd += opts.mpiexec_args
    sel = selectors.DefaultSelector()
    listener.setblocking(False)
    sel.register(listener, selectors.EVENT_READ, None)
    ranks: list[Rank] = []
    done_since = None  # when every rank seen had exited or been lost
    try:
        proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    except OSError as e:
        sel.close()
        listener.close()
        raise SystemExit(
            f"fluxmpi_py.run: cannot run mpiexec {opts.mpiexec!r}: {e.strerror or e} "
            "(--mpiexec PATH names another)"
        ) from None
    rounds = 0  # select rounds: ranks seen to exit in the same round exited together
    _RUNNING[:] = [proc]
    started = time.monotonic()
    try:
        # Once mpiexec has ended, the rounds go on without waiting until no event is left (at
        # most 1 s): its ranks' last words and their ends can be waiting still, and a rank's end
        # read only later would be missing from what the launcher reports (under load, the one
        # round that saw mpiexec end had read a rank's "exit 0" and not yet its end).
        ended_at = 0.0
        while True:
            running = proc.poll() is None
            if not running and not ended_at:
                ended_at = time.monotonic()
            events = sel.select(timeout=0.25 if running else 0)
            if not running and (not events or time.monotonic() - ended_at > 1.0):
                break
            rounds += 1
            for key, _ in events:
                if key.data is None:
                    conn, _ = listener.accept()
                    conn.setblocking(False)
                    keepalive(conn, opts.keepalive_s)
                    ranks.append(Rank(conn=conn))
                    sel.register(conn, selectors.EVENT_READ, ranks[-1])
                    continue
                r: Rank = key.data
                try:
                    data = _sock(key).recv(4096)
                except BlockingIOError:
                    continue
                except OSError as e:  # ETIMEDOUT from keepalive, EHOSTUNREACH: the host is gone
                    r.lost = e.strerror or str(e)
                    data = None
                if data:
                    r.buffer += data
                    line, sep, tail = r.buffer.partition(b"\n")
                    if sep and r.rank < 0:
                        try:
                            me = json.loads(line)
                            r.rank, r.size = int(me["rank"]), int(me["size"])
                            r.host, r.pid = str(me["host"]), int(me["pid"])
                            r.start = int(me.get("start", 0))
                        except (ValueError, KeyError, TypeError):
                            pass
                    # the shrink mode: a survivor names the processes it excluded (hung ones)
                    now_s = time.monotonic() - started
                    for hung in newly_excluded(ranks, parse_excluded(tail), now_s):
                        hung.gone_at = rounds
                        print(end_excluded(hung), file=sys.stderr, flush=True)
                    continue
                r.ended = not r.lost
                r.status = parse_exit(r.buffer.partition(b"\n")[2])
                r.gone_at = rounds
                r.gone_s = time.monotonic() - started
                sel.unregister(key.fileobj)
                _sock(key).close()
            # Judged once every rank of the world has connected (a rank that dies before it
            # connects ends the job the ordinary way): all of them exited, lost, or excluded by
            # the survivors (a hung rank, which mpiexec would wait for).
            size = max((r.size for r in ranks), default=0)
            known = sum(r.rank >= 0 for r in ranks)
            gone = all(r.ended or r.lost or r.excluded_s >= 0 for r in ranks)
            if running and size and known >= size and gone:
                done_since = done_since or time.monotonic()
                if time.monotonic() - done_since >= opts.grace_s:
                    status, why = verdict(ranks, opts.grace_s, opts.elastic)
                    if opts.elastic:
                        report_lost(ranks)
                    print(why, file=sys.stderr, flush=True)
                    _end(proc)
                    return Outcome(status, why.removeprefix("fluxmpi_py.run: "))
            else:
                done_since = None
        if opts.elastic:
            report_lost(ranks)
        return ended_by(proc, ranks)
    except KeyboardInterrupt:
        _end(proc)
        return Outcome(128 + signal.SIGINT, "interrupted (Ctrl-C or SIGINT)", stopped=True)
    except _Stopped:
        _end(proc)
        return Outcome(128 + signal.SIGTERM, "the launcher got SIGTERM", stopped=True)
    finally:
        _RUNNING.clear()
        if proc.poll() is None:
            _end(proc)
        for key in list(sel.get_map().values()):
            _sock(key).close()
        sel.close()


def run_job(opts: RunOptions, restart: int = 0) -> int:
    """Run mpiexec once, watching the ranks, with ``FLUXMPI_RESTART=restart``; its exit
    status (128 + N when signal N ended it), or LOST_STATUS when the launcher had to end it.
    Ctrl-C ends the whole job (130).

    >>> run_job(RunOptions(mpiexec_args=["-n", "1", sys.executable, "-c", "pass"]))  # doctest: +SKIP
    0
    """
    return _launch(opts, restart).status


def run_with_restarts(opts: RunOptions) -> int:
    """Run the job, relaunching it after a failure up to ``opts.max_restarts`` times (each
    announced on stderr); the last attempt's status. A job stopped from outside (Ctrl-C,
    SIGTERM) is not relaunched.

    >>> run_with_restarts(RunOptions(mpiexec_args=["-n", "2", "python", "t.py"], max_restarts=1))  # doctest: +SKIP
    0
    """
    attempts = opts.max_restarts + 1
    for restart in range(attempts):
        outcome = _launch(opts, restart)
        if outcome.status == 0:
            return 0
        where = f"fluxmpi_py.run: attempt {restart + 1} of {attempts}"
        if outcome.stopped:
            if opts.max_restarts:
                print(f"{where}: {outcome.how}; not relaunched", file=sys.stderr, flush=True)
            return outcome.status
        if restart + 1 < attempts:
            print(
                f"{where} failed: {outcome.how}. Relaunching now ({RESTART_ENV}={restart + 1}; "
                f"restart {restart + 1} of {opts.max_restarts})",
                file=sys.stderr,
                flush=True,
            )
        elif opts.max_restarts:
            print(
                f"{where} failed: {outcome.how}. No restarts left "
                f"(--max-restarts {opts.max_restarts}); exiting with status {outcome.status}",
                file=sys.stderr,
                flush=True,
            )
    return outcome.status


def _stop(signum, frame) -> None:
    raise _Stopped()


def _forward(signum, frame) -> None:
    """SIGUSR1 to the launcher: to mpiexec, which passes it on to the ranks."""
    for proc in _RUNNING:
        if proc.poll() is None:
            proc.send_signal(signum)


def main(argv: list[str] | None = None) -> int:
    """The command line: ``python -m fluxmpi_py.run [options] MPIEXEC-ARGS...``."""
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    if threading.current_thread() is not threading.main_thread():
        return run_with_restarts(opts)
    previous = signal.signal(signal.SIGTERM, _stop)
    previous_usr1 = signal.signal(signal.SIGUSR1, _forward)
    try:
        return run_with_restarts(opts)
    except KeyboardInterrupt:  # between launches: no mpiexec to end
        return 128 + signal.SIGINT
    except _Stopped:
        return 128 + signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGUSR1, previous_usr1)


if __name__ == "__main__":
    sys.exit(main())
