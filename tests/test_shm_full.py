"""A /dev/shm too small for the direct agreements' shared-memory slots
(csrc/backend/mpi_direct_slots.cpp): the slots reserve their pages when made, so a full file
system refuses there, on one rank or all, and every rank keeps sending its payloads as messages
(right results, no slot written), instead of a SIGBUS at a later write into a page the file
system cannot give. Two ranks in a mount namespace of their own with a 3 MiB /dev/shm: Open
MPI's own segments fit (sparse), two ranks' 2 MiB of slots each do not."""

import os
import shlex
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from launch_env import mpi_env  # noqa: E402
from mpi_util import find_mpiexec  # noqa: E402

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


@pytest.mark.skipif(REASON is not None, reason=str(REASON))
@pytest.mark.parametrize("size, slots", [("3m", False), ("64m", True)])
def test_a_small_dev_shm_keeps_the_messages(size, slots, tmp_path):
    script = tmp_path / "shm_full.py"
    script.write_text(SCRIPT)
    job = [find_mpiexec(), "-n", "2", "--oversubscribe", sys.executable, str(script)]
    inner = f"mount -t tmpfs -o size={size} tmpfs /dev/shm && exec {shlex.join(job)}"
    env = mpi_env({"OMPI_MCA_btl": "^ofi"})
    proc = subprocess.run(
        ["unshare", "-m", "sh", "-c", inner], env=env, capture_output=True, text=True, timeout=120
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    # rank 0 sends every payload (4 broadcasts from it, 4 reductions to rank 1): with room the
    # slots carry all 8, without none
    assert f"rank 0 right, slot writes {8 if slots else 0}" in out, out[-4000:]
    assert "rank 1 right, slot writes 0" in out, out[-4000:]
