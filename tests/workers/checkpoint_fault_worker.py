"""Checkpoints under faults; run by tests/test_checkpoint_faults.py.

    checkpoint_fault_worker.py MODE[,MODE...] DIR   (the modes one after another, one launch)

``kill_during_write``: save a checkpoint (step 1), then save another (step 2) while rank 0's
write stalls half way and the last rank SIGKILLs itself; the job dies. ``verify``: every rank
loads DIR/ckpt.pt, checks that it is the intact step-1 checkpoint and prints the temporary
files it sees there. ``save_again``: save
step 3 (which removes the killed write's temporary file). ``full_disk`` (DIR is a
small file system): save a small checkpoint, then one too large for the disk; every rank must
get the same clear OSError, and the small checkpoint must still load.
"""

import io
import os
import signal
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import fluxmpi_py as fm  # noqa: E402


def model_of(step):
    torch.manual_seed(step)
    return torch.nn.Linear(4, 2)


def stall_half_way(real_save):
    """torch.save that writes half of the file, then hangs (rank 0, mid-write)."""

    def save(obj, f):
        buf = io.BytesIO()
        real_save(obj, buf)
        data = buf.getvalue()
        f.write(data[: len(data) // 2])
        f.flush()
        print(f"rank 0: wrote {len(data) // 2} of {len(data)} bytes, stalling", flush=True)
        time.sleep(120)

    return save


def kill_when_written(directory):
    """Watch for rank 0's temporary file to have bytes, then SIGKILL this process."""
    while True:
        for name in os.listdir(directory):
            if name.startswith(".ckpt.pt.tmp") and os.path.getsize(os.path.join(directory, name)):
                print(f"rank {fm.local_rank()}: killing myself during the write", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.01)


def kill_during_write(directory):
    path = os.path.join(directory, "ckpt.pt")
    fm.save_checkpoint(path, model=model_of(1), step=1)
    rank = fm.local_rank()
    if rank == 0:
        torch.save = stall_half_way(torch.save)
    if rank == fm.total_workers() - 1:
        threading.Thread(target=kill_when_written, args=(directory,), daemon=True).start()
    fm.save_checkpoint(path, model=model_of(2), step=2)
    raise AssertionError("save_checkpoint returned although a rank was killed")


def verify(directory):
    model = torch.nn.Linear(4, 2)
    loaded = fm.load_checkpoint(os.path.join(directory, "ckpt.pt"), model=model)
    expected = model_of(1)
    assert loaded["step"] == 1, loaded["step"]
    assert torch.equal(model.weight, expected.weight) and torch.equal(model.bias, expected.bias)
    left = sorted(n for n in os.listdir(directory) if ".tmp" in n)
    print(f"rank {fm.local_rank()}: loaded step 1 intact; temporaries: {left}", flush=True)


def save_again(directory):
    fm.save_checkpoint(os.path.join(directory, "ckpt.pt"), model=model_of(3), step=3)
    print(f"rank {fm.local_rank()}: saved step 3", flush=True)


def full_disk(directory):
    path = os.path.join(directory, "ckpt.pt")
    fm.save_checkpoint(path, model=model_of(1), step=1)
    try:
        fm.save_checkpoint(path, model=model_of(2), big=torch.zeros(1 << 20), step=2)  # 4 MiB
    except OSError as e:
        message = str(e)
    else:
        raise AssertionError("save_checkpoint did not raise on a full disk")
    for needle in (
        "No space left on device",
        f"save_checkpoint: could not write {path!r}",
        "the previous file is kept",
        "(on rank 0, in save_checkpoint(",
    ):
        assert needle in message, f"rank {fm.local_rank()}: {needle!r} not in {message!r}"
    leftovers = [n for n in os.listdir(directory) if n != "ckpt.pt"]
    assert not leftovers, leftovers
    print(f"rank {fm.local_rank()}: full disk reported: {message}", flush=True)
    verify(directory)


if __name__ == "__main__":
    torch.set_num_threads(1)
    fm.Init()
    modes = {
        "kill_during_write": kill_during_write,
        "verify": verify,
        "save_again": save_again,
        "full_disk": full_disk,
    }
    for mode in sys.argv[1].split(","):
        modes[mode](sys.argv[2])
