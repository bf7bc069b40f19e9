"""Checkpoints under faults at 2 ranks (tests/workers/checkpoint_fault_worker.py): a rank
killed while rank 0 writes leaves the previous checkpoint intact, and the next save removes
the temporary file that the killed write left; a full disk gives every rank
the same clear OSError and keeps the previous file."""

import ast
import os
import re
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import run_mpi  # noqa: E402

WORKER = "checkpoint_fault_worker.py"


def test_rank_killed_while_rank0_writes_keeps_the_previous_checkpoint(tmp_path):
    d = str(tmp_path)
    rc, out = run_mpi(WORKER, 2, "kill_during_write", d, timeout=90, expect_ok=False)
    assert rc != 0, out[-3000:]
    assert "stalling" in out and "rank 1: killing myself during the write" in out, out[-3000:]
    # one launch: verify, then save again
    _, out = run_mpi(WORKER, 2, "verify,save_again", d, timeout=90)
    assert "rank 0: loaded step 1 intact" in out and "rank 1: loaded step 1 intact" in out
    # the write was cut short: its temporary file was left, as rank 0 saw before saving again
    # (the list alone: the ranks' lines can run together when their writes interleave)
    seen = re.search(r"rank 0: loaded step 1 intact; temporaries: (\[[^\]]*\])", out)
    assert seen and [n for n in ast.literal_eval(seen.group(1)) if n.startswith(".ckpt.pt.tmp")], (
        out[-3000:]
    )
    assert "rank 0: saved step 3" in out, out[-3000:]  # the next save removed it
    assert not [n for n in os.listdir(d) if ".tmp" in n], os.listdir(d)


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs, where this process may mount one (root); skipped otherwise."""
    mnt = tmp_path / "small-disk"
    mnt.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {proc.stderr.strip() or proc.returncode}")
    try:
        yield str(mnt)
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_full_disk_raises_on_every_rank_and_keeps_the_previous_file(small_disk):
    _, out = run_mpi(WORKER, 2, "full_disk", small_disk, timeout=90)
    for r in (0, 1):
        assert f"rank {r}: full disk reported: [Errno 28]" in out, out[-3000:]
        assert f"rank {r}: loaded step 1 intact" in out, out[-3000:]
