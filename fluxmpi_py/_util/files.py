"""The one atomic file writer: checkpoints, launch() results and the preferences file."""

from __future__ import annotations

import os
from typing import IO, Any, Callable


class _Recording:
    """A binary file whose write errors are kept: writers such as torch.save turn a failed
    write (a full disk) into their own error, without the OSError that says why."""

    def __init__(self, f: IO[bytes]):
        self._f = f
        self.error: OSError | None = None

    def write(self, b) -> int | None:
        try:
            return self._f.write(b)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self._f.flush()


def write_atomic(path: str, data: bytes | Callable[[Any], None], *, durable: bool = False) -> None:
    """Write ``data`` (bytes, or a function that writes to the open binary file) to ``path``
    so that a reader sees the old file or the whole new one, never a part: it goes to a
    temporary name in the same directory, which is then renamed over ``path``. With
    ``durable``, the file and the rename are fsynced, so they survive a crash of the machine.
    On an error the temporary file is removed and the error raised; where a writer function
    failed after a write to the file did, the write's OSError is raised (from the writer's).

    >>> import os, tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "x.bin")
    >>> write_atomic(p, b"abc"); open(p, "rb").read()
    b'abc'
    >>> write_atomic(p, lambda f: f.write(b"de"), durable=True); open(p, "rb").read()
    b'de'
    """
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            if callable(data):
                recording = _Recording(f)
                try:
                    data(recording)
                except Exception as e:
                    if recording.error is None or e is recording.error:
                        raise
                    raise recording.error from e
            else:
                f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
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
