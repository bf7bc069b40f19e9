"""The one atomic file writer (checkpoints, launch() results, the preferences file), the
clean-up of the temporary files that killed writers left, and the digest trailer that lets a
reader tell a damaged file from a good one."""

from __future__ import annotations

import hashlib
import os
import re
import socket
import threading
import zlib
from typing import IO, Any, Callable

# The digest trailer: a fixed-size line appended after the file's own bytes (torch.load, like
# any zip reader, finds its directory from the end and reads past it):
#   b"\n#fluxmpi_py-digest <algorithm:8> <hex digest:64> <bytes before the trailer:20>\n"
_MAGIC = b"\n#fluxmpi_py-digest "
_TRAILER_BYTES = len(_MAGIC) + 8 + 1 + 64 + 1 + 20 + 1
DIGESTS = ("sha256", "crc32")
_CHUNK = 8 << 20  # bytes per read while checking a digest


class _Hash:
    """hashlib's interface over zlib.crc32 too: update(bytes), hexdigest()."""

    def __init__(self, algorithm: str):
        if algorithm not in DIGESTS:
            raise ValueError(f"unknown digest {algorithm!r}: expected one of {DIGESTS}")
        self._sha = hashlib.sha256() if algorithm == "sha256" else None
        self._crc = 0

    def update(self, b) -> None:
        if self._sha is not None:
            self._sha.update(b)
        else:
            self._crc = zlib.crc32(b, self._crc)

    def hexdigest(self) -> str:
        return self._sha.hexdigest() if self._sha is not None else f"{self._crc:08x}"


def _trailer(algorithm: str, hexdigest: str, length: int) -> bytes:
    out = b"%s%-8s %64s %020d\n" % (_MAGIC, algorithm.encode(), hexdigest.encode(), length)
    assert len(out) == _TRAILER_BYTES
    return out


class _Recording:
    """A binary file whose write errors are kept: writers such as torch.save turn a failed
    write (a full disk) into their own error, without the OSError that says why. With a
    digest, every byte written is hashed on the way."""

    def __init__(self, f: IO[bytes], digest: _Hash | None = None):
        self._f = f
        self._digest = digest
        self.error: OSError | None = None
        self.written = 0

    def write(self, b) -> int | None:
        try:
            n = self._f.write(b)
        except OSError as e:
            self.error = e
            raise
        if self._digest is not None:
            self._digest.update(b)
        self.written += memoryview(b).nbytes
        return n

    def flush(self) -> None:
        self._f.flush()


_HOST = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname()) or "host"


def _temp_name(path: str) -> str:
    """``.<name>.tmp<pid>.<host>`` beside ``path``: whose it is, to tell a stale one."""
    directory, base = os.path.split(os.path.abspath(path))
    return os.path.join(directory, f".{base}.tmp{os.getpid()}.{_HOST}")


# Any writer's temporary name: ``.<name>.tmp<pid>`` with ``.<host>`` or without (older ones).
_TEMPORARY = re.compile(r"\..+\.tmp[0-9]+(?:\.[A-Za-z0-9-]+)?")


def is_temporary(name: str) -> bool:
    """Whether the file name ``name`` is one of :func:`write_atomic`'s temporary names
    (a write in progress, or one a killed writer left): never a complete file.

    >>> is_temporary(".ckpt.pt.tmp4711.node1"), is_temporary("ckpt.pt")
    (True, False)
    """
    return _TEMPORARY.fullmatch(name) is not None


def _writing(pid: int, file: str) -> bool:
    """Whether process ``pid`` may still be writing ``file``. A writer holds its temporary
    file open from its creation to its rename (:func:`write_atomic` renames before closing),
    so a live process that does not hold it is another process that was given the dead
    writer's pid. Where ``/proc`` cannot tell (another system, someone else's process), a
    live process counts as the writer."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: someone else's live process
        return True
    fds = f"/proc/{pid}/fd"
    try:
        links = os.listdir(fds)
    except OSError:
        return True
    for fd in links:
        try:
            if os.readlink(os.path.join(fds, fd)) == file:
                return True
        except OSError:  # closed meanwhile
            continue
    return False


def remove_stale_temporaries(path: str) -> list[str]:
    """Remove the temporary files that writers of ``path`` killed mid-write left beside it:
    names ``.<name>.tmp<pid>.<this host>`` (or ``.<name>.tmp<pid>``, written before the host
    was part of the name) whose writer is gone: no process of that pid, or one that does not
    hold the file open (the pid given to another process). Files of any other name, of
    another host, of this process or of a writer still at work are kept. Returns the removed
    paths.

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp(); p = os.path.join(d, "x.pt")
    >>> open(os.path.join(d, ".x.pt.tmp999999999"), "wb").close()   # no such process
    >>> [os.path.basename(r) for r in remove_stale_temporaries(p)]
    ['.x.pt.tmp999999999']
    """
    directory, base = os.path.split(os.path.abspath(path))
    pattern = re.compile(rf"\.{re.escape(base)}\.tmp([0-9]+)(?:\.([A-Za-z0-9-]+))?")
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed  # the write that follows reports a missing directory
    for name in names:
        m = pattern.fullmatch(name)
        if m is None or m.group(2) not in (None, _HOST):
            continue
        pid, file = int(m.group(1)), os.path.join(directory, name)
        if pid == os.getpid() or _writing(pid, file):
            continue
        try:
            os.unlink(file)
            removed.append(file)
        except OSError:
            pass  # gone already, or not ours to remove: leave it
    return removed


def write_atomic(
    path: str,
    data: bytes | Callable[[Any], None],
    *,
    durable: bool = False,
    digest: str | None = None,
) -> None:
    """Write ``data`` (bytes, or a function that writes to the open binary file) to ``path``
    so that a reader sees the old file or the whole new one, never a part: it goes to a
    temporary name in the same directory, which is then renamed over ``path``. With
    ``durable``, the file and the rename are fsynced, so they survive a crash of the machine.
    On an error the temporary file is removed and the error raised; where a writer function
    failed after a write to the file did, the write's OSError is raised (from the writer's).
    Temporary files of ``path`` that killed writers left are removed first
    (:func:`remove_stale_temporaries`). With ``digest`` ("sha256" or "crc32"), the file ends
    with a trailer holding that digest of its bytes, which :func:`check_digest` verifies.

    >>> import os, tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "x.bin")
    >>> write_atomic(p, b"abc"); open(p, "rb").read()
    b'abc'
    >>> write_atomic(p, lambda f: f.write(b"de"), durable=True); open(p, "rb").read()
    b'de'
    >>> write_atomic(p, b"de", digest="crc32"); check_digest(p)
    'crc32'
    """
    hasher = _Hash(digest) if digest is not None else None
    remove_stale_temporaries(path)
    directory = os.path.dirname(os.path.abspath(path))
    tmp = _temp_name(path)
    try:
        with open(tmp, "wb") as f:
            recording = _Recording(f, hasher)
            if callable(data):
                try:
                    data(recording)
                except Exception as e:
                    if recording.error is None or e is recording.error:
                        raise
                    raise recording.error from e
            else:
                recording.write(data)
            if hasher is not None and digest is not None:
                f.write(_trailer(digest, hasher.hexdigest(), recording.written))
            f.flush()  # all of it in the file before a reader can open it by its name
            if durable:
                os.fsync(f.fileno())
            # renamed while still open: a temporary name that exists is held open by its
            # writer, which tells it from a live process that got a dead writer's pid
            os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if not durable:
        return
    try:  # make the rename itself durable; not every file system lets a directory be opened
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def check_digest(path: str) -> str | None:
    """Verify the digest trailer that ``write_atomic(digest=...)`` appended to ``path``:
    return its algorithm, None when the file has no trailer, and raise
    ValueError naming the path and what does not match otherwise.

    >>> import os, tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "x.bin")
    >>> write_atomic(p, b"abc", digest="sha256"); check_digest(p)
    'sha256'
    >>> write_atomic(p, b"abc"); check_digest(p) is None
    True
    """
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < _TRAILER_BYTES:
            return None
        f.seek(size - _TRAILER_BYTES)
        tail = f.read(_TRAILER_BYTES)
        if not tail.startswith(_MAGIC):
            return None
        fields = tail[len(_MAGIC) :].split()
        try:
            algorithm, stored, length = fields[0].decode(), fields[1].decode(), int(fields[2])
            hasher = _Hash(algorithm)
        except (IndexError, ValueError, UnicodeDecodeError):
            raise ValueError(f"{path!r} is damaged: its digest trailer is unreadable") from None
        if length != size - _TRAILER_BYTES:
            raise ValueError(
                f"{path!r} is damaged: its digest covers {length} bytes, the file has "
                f"{size - _TRAILER_BYTES} before the digest (truncated or extended)"
            )
        f.seek(0)
        buf = bytearray(min(_CHUNK, max(length, 1)))
        view = memoryview(buf)
        left = length
        while left:
            n = f.readinto(view[: min(left, len(buf))])
            if not n:
                raise ValueError(f"{path!r} is damaged: it ended while being read")
            hasher.update(view[:n])
            left -= n
    computed = hasher.hexdigest()
    if computed != stored:
        raise ValueError(
            f"{path!r} is damaged: its {algorithm} digest does not match its contents "
            f"(stored {stored}, computed {computed})"
        )
    return algorithm


def start_digest_check(path: str) -> Callable[[], str | None]:
    """Start :func:`check_digest` of ``path`` on a thread of its own (reading and hashing
    release the GIL, so it overlaps a reader of the same file on another core); returns a
    function that waits for it and returns or raises its result.

    >>> import os, tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "x.bin")
    >>> write_atomic(p, b"abc", digest="crc32"); start_digest_check(p)()
    'crc32'
    """
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = check_digest(path)
        except BaseException as e:  # noqa: BLE001 - handed to the waiter
            out["error"] = e

    thread = threading.Thread(target=run, name="fluxmpi_py-digest-check", daemon=True)
    thread.start()

    def result() -> str | None:
        thread.join()
        if "error" in out:
            raise out["error"]
        return out["value"]

    return result
