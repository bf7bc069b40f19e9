"""A /dev/shm too small for our shared memory (csrc/backend/shm_segment.cpp): the direct
agreements' slots (backend/mpi_direct_slots.cpp) and the grouped collectives' windows
(backend/mpi_shared_pieces.cpp, DistributedOptimizer(deterministic=True)'s owners). Each reserves
its pages when made, so a full file system refuses there, on one rank or all, and every rank
keeps its messages (right results, the same bits, nothing through shared memory), instead of a
SIGBUS at a later write into a page the file system cannot give. Two ranks in a mount namespace
of their own with a 3 MiB /dev/shm: Open MPI's own segments fit (sparse), two ranks' 2 MiB of
slots or 4 MiB of window each do not."""

import os
import re
import shlex
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from launch_env import mpi_env  # noqa: E402
from mpi_util import find_mpiexec, worker_path  # noqa: E402

SCRIPT = """
import torch, fluxmpi_py as fm
from fluxmpi_py import _core
fm.Init(verbose=False)
r = fm.local_rank()
for i in range(4):
    t = torch.full((262144,), float(r + 1 + i))  # 1 MiB: a slot's size
    fm.bcast_(t, root_rank=0)
    assert t.eq(1 + i).all(), (r, i, t[0])
    fm.reduce_(t, root_rank=1)
    assert r != 1 or t.eq(2 * (1 + i)).all(), (r, i, t[0])
print(f"rank {r} right, slot writes {_core.C.direct_slot_writes()}", flush=True)
"""


def _can_mount():
    if os.geteuid() != 0:
        return "needs root (a mount namespace with a small /dev/shm)"
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"],
        capture_output=True,
        text=True,
    )
    return None if probe.returncode == 0 else f"cannot mount a tmpfs: {probe.stderr.strip()}"


REASON = _can_mount()


def run_in_dev_shm(size, script):
    """Two ranks of `script` with a /dev/shm of `size` (tmpfs's size=); their output."""
    job = [find_mpiexec(), "-n", "2", "--oversubscribe", sys.executable, script]
    inner = f"mount -t tmpfs -o size={size} tmpfs /dev/shm && exec {shlex.join(job)}"
    env = mpi_env({"OMPI_MCA_btl": "^ofi"})
    proc = subprocess.run(
        ["unshare", "-m", "sh", "-c", inner], env=env, capture_output=True, text=True, timeout=120
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return out


@pytest.mark.skipif(REASON is not None, reason=str(REASON))
@pytest.mark.parametrize("size, slots", [("3m", False), ("64m", True)])
def test_a_small_dev_shm_keeps_the_messages(size, slots, tmp_path):
    script = tmp_path / "shm_full.py"
    script.write_text(SCRIPT)
    out = run_in_dev_shm(size, str(script))
    # rank 0 sends every payload (4 broadcasts from it, 4 reductions to rank 1): with room the
    # slots carry all 8, without none
    assert f"rank 0 right, slot writes {8 if slots else 0}" in out, out[-4000:]
    assert "rank 1 right, slot writes 0" in out, out[-4000:]


@pytest.mark.skipif(REASON is not None, reason=str(REASON))
def test_a_small_dev_shm_keeps_the_deterministic_bits():
    # deterministic=True's owners, a grouped allreduce and a reduce-scatter: through shared
    # memory with room, by messages without (the grouped allreduce by the ring: "ring 1" both
    # times), the same bits on each rank either way
    lines = {}
    for size in ("3m", "64m"):
        out = run_in_dev_shm(size, worker_path("deterministic_shm_worker.py"))
        lines[size] = dict(re.findall(r"^rank (\d) (digest \S+) owner .*$", out, re.M))
        assert (
            re.findall(r"^rank \d digest \S+ (owner \d+ scatter \d+ ring \d+)$", out, re.M)
            == ["owner 0 scatter 0 ring 1" if size == "3m" else "owner 16 scatter 1 ring 1"] * 2
        ), out[-4000:]
    assert lines["3m"] == lines["64m"] and len(lines["3m"]) == 2, lines
