"""Checkpoints that must not load wrong (issue 33): damaged files and files without a digest,
loads that do not fit, stale temporaries, reserved keywords, and latest_checkpoint past
temporaries and damaged files (the round trips: checkpoint_worker.py).
"""

import os
import shutil

import torch
from checkpoint_worker import flat, path_of, raises

import fluxmpi_py as fm


def flip_bytes(path, offset, n=64):
    """Rank 0 inverts n bytes of the file at offset (from the end when negative)."""
    if fm.local_rank() == 0:
        with open(path, "r+b") as f:
            f.seek(offset, os.SEEK_SET if offset >= 0 else os.SEEK_END)
            at = f.tell()
            data = bytes(b ^ 0xFF for b in f.read(n))
            f.seek(at)
            f.write(data)
    fm.barrier()


def case_damaged_file_raises_on_every_rank_and_loads_nothing():
    saved = torch.nn.Linear(64, 64)
    path = fm.save_checkpoint(path_of("damaged.pt"), model=saved)
    size = os.path.getsize(path)
    for offset in (size // 2, -40):  # inside the weights; inside the digest trailer
        path = fm.save_checkpoint(path_of("damaged.pt"), model=saved)
        flip_bytes(path, offset)
        model = torch.nn.Linear(64, 64)
        before = flat(model)
        with raises(ValueError, "damaged.pt", "is damaged", "on rank 0", "nothing was loaded"):
            fm.load_checkpoint(path, model=model)
        assert torch.equal(flat(model), before), f"rank {fm.local_rank()}: model was changed"


def case_checkpoint_without_digest_loads_with_a_warning():
    import warnings

    path = path_of("v1.pt")
    saved = torch.nn.Linear(3, 2)
    if fm.local_rank() == 0:  # as save_checkpoint wrote them before digests (version 1)
        objects = {"model": saved.state_dict(), "step": 4}
        payload = {"format": "fluxmpi_py.checkpoint", "version": 1, "objects": objects}
        torch.save(payload, path)
    fm.barrier()
    model = torch.nn.Linear(3, 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert fm.load_checkpoint(path, model=model)["step"] == 4
    assert torch.equal(model.weight, fm.synchronize_(saved).weight)
    if fm.local_rank() == 0:
        assert any("cannot be checked for damage" in str(w.message) for w in caught), caught


def case_load_that_does_not_fit_changes_nothing():
    def net(last):
        torch.manual_seed(last.out_features)  # the same on every rank
        return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), last)

    saved = net(torch.nn.Linear(3, 2))
    opt = torch.optim.Adam(saved.parameters())
    saved(torch.randn(2, 4)).sum().backward()
    opt.step()
    path = fm.save_checkpoint(path_of("fit.pt"), model=saved, optimizer=opt, step=1)

    other = net(torch.nn.Linear(3, 5))  # another last layer: the first one would fit
    before = flat(other)
    with raises(ValueError, "model= does not fit", r"'2.weight' has shape \(2, 3\)", "nothing"):
        fm.load_checkpoint(path, model=other)
    assert torch.equal(flat(other), before), "the layers that fit were overwritten"

    model = net(torch.nn.Linear(3, 2))
    before = flat(model)
    two_groups = torch.optim.Adam(
        [{"params": model[0].parameters()}, {"params": model[2].parameters(), "lr": 0.1}]
    )
    with raises(
        ValueError, "optimizer= does not fit", "1 parameter groups in the checkpoint, 2 here"
    ):
        fm.load_checkpoint(path, model=model, optimizer=two_groups)
    assert torch.equal(flat(model), before), "the model was restored although the optimizer failed"
    assert not two_groups.state

    # Adam's state of another shape (torch would load it and fail at the next step).
    bad = torch.load(path)["objects"]
    bad["optimizer"]["state"][0]["exp_avg"] = torch.zeros(7)
    path2 = fm.save_checkpoint(path_of("fit2.pt"), **bad)
    fresh = torch.optim.Adam(model.parameters())
    with raises(ValueError, "optimizer= does not fit", "'exp_avg' of parameter 0 of group 0"):
        fm.load_checkpoint(path2, model=model, optimizer=fresh)
    assert torch.equal(flat(model), before) and not fresh.state

    # A tensor target of another shape is not broadcast into.
    w = torch.zeros(2, 2)
    fm.save_checkpoint(path_of("fit3.pt"), w=torch.ones(2))
    with raises(ValueError, "w= does not fit", r"shape \(2,\) in the checkpoint, \(2, 2\)"):
        fm.load_checkpoint(path_of("fit3.pt"), w=w)
    assert not w.any()

    # The ranks stay in step: a load that fits works right after.
    assert fm.load_checkpoint(path, model=model, optimizer=opt)["step"] == 1
    assert torch.equal(flat(model), flat(torch.load(path)["objects"]["model"].values()))


def _dead_pid():
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def case_stale_temporaries_removed_at_the_next_save():
    import subprocess
    import sys

    from fluxmpi_py._util import files as _files

    path = path_of("stale.pt")
    d = os.path.dirname(path)
    live, other, names = None, None, None
    if fm.local_rank() == 0:  # rank 0 saves, so the processes are on its host
        # `live` holds its two files open, as a save in progress does; `other` is alive but
        # holds nothing, as a process that got a killed writer's pid
        hold = "import sys, time; fs = [open(p, 'ab') for p in sys.argv[1:]]; print('open')"
        hold += "; sys.stdout.flush(); time.sleep(60)"
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        dead, host = _dead_pid(), _files._HOST
        writing = [".stale.pt.tmp{}", ".stale.pt.tmp{}." + host]
        stale = [
            f".stale.pt.tmp{dead}",
            f".stale.pt.tmp{dead}.{host}",
            f".stale.pt.tmp{other.pid}",  # pids given to another process
            f".stale.pt.tmp{other.pid}.{host}",
        ]
        kept = [
            f".stale.pt.tmp{dead}.other-host",  # another host's: cannot tell
            f".stale.pt.tmp{dead}x",  # other patterns
            f"stale.pt.tmp{dead}",
            f".other.pt.tmp{dead}",
            f".stale.pt.tmp{dead}.{host}.bak",
        ]
        for name in stale + kept:
            with open(os.path.join(d, name), "wb") as f:
                f.write(b"partial")
        # a writer's names carry its pid, known once it runs: it opens placeholder names,
        # which are then renamed to its pid (an open descriptor follows its file)
        live = subprocess.Popen(
            [sys.executable, "-c", hold, *(os.path.join(d, n.format("X")) for n in writing)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert live.stdout.readline().strip() == "open"
        for n in writing:
            os.rename(os.path.join(d, n.format("X")), os.path.join(d, n.format(live.pid)))
        kept += [n.format(live.pid) for n in writing]  # saves in progress
        names = (stale, kept)
    stale, kept = fm.broadcast_object(names)
    try:
        fm.save_checkpoint(path, step=1)
        present = set(os.listdir(d))
        assert not present & set(stale), sorted(present & set(stale))
        assert set(kept) <= present, sorted(set(kept) - present)
    finally:
        for p in (live, other):
            if p is not None:
                p.kill()
                p.wait()
    fm.barrier()


def case_reserved_keywords_are_checked():
    path = path_of("reserved.pt")
    model = torch.nn.Linear(2, 2)
    with raises(TypeError, "rng= is reserved", "got a Tensor", "rng_state=", "on rank 0"):
        fm.save_checkpoint(path, model=model, rng=torch.get_rng_state())
    last = fm.total_workers() - 1
    mine = torch.get_rng_state() if fm.local_rank() == last else False
    with raises(TypeError, "rng= is reserved", f"on rank {last}"):
        fm.save_checkpoint(path, model=model, rng=mine)
    fm.save_checkpoint(path, model=model, rng_state=torch.get_rng_state())
    got = fm.load_checkpoint(path)
    assert torch.equal(got["rng_state"], fm.synchronize_(torch.get_rng_state()))
    with raises(TypeError, "rng= is reserved"):
        fm.load_checkpoint(path, rng=torch.get_rng_state())
    with raises(TypeError, "weights_only= is reserved"):
        fm.load_checkpoint(path, weights_only=torch.zeros(1))


def case_latest_checkpoint_skips_temporaries_and_damaged_files():
    import warnings

    d = os.path.join(os.path.dirname(path_of("x")), "latest")
    rank, last = fm.local_rank(), fm.total_workers() - 1
    if rank == 0:
        os.makedirs(d, exist_ok=True)
    fm.barrier()
    assert fm.latest_checkpoint(d) is None
    assert fm.latest_checkpoint(os.path.join(d, "not-yet")) is None
    model = torch.nn.Linear(2, 2)
    for step in (2, 10, 11):
        fm.save_checkpoint(os.path.join(d, f"ckpt-{step}.pt"), model=model, step=step)
    assert os.path.basename(fm.latest_checkpoint(d)) == "ckpt-11.pt"

    def at(name):
        return os.path.join(d, name)

    if rank == 0:
        # newer than all of them: a complete copy under a temporary name (a save about to be
        # renamed), ckpt-11 damaged, ckpt-13 without a digest trailer
        shutil.copy(at("ckpt-11.pt"), at(".ckpt-12.pt.tmp4242.somehost"))
        with open(at("ckpt-11.pt"), "r+b") as f:
            f.seek(os.path.getsize(at("ckpt-11.pt")) // 2)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0xFF]))
        torch.save({"step": 13}, at("ckpt-13.pt"))
        t = 1_700_000_000 * 10**9
        # ckpt-2 and ckpt-10 as old as each other: the name decides, numbers as numbers
        for i, name in enumerate(
            ["ckpt-2.pt", "ckpt-10.pt", "ckpt-11.pt", "ckpt-13.pt", ".ckpt-12.pt.tmp4242.somehost"]
        ):
            os.utime(at(name), ns=(t + max(i, 1), t + max(i, 1)))
    fm.barrier()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = fm.latest_checkpoint(d, "*")
    assert os.path.basename(got) == "ckpt-10.pt", got
    if rank == 0:
        said = " | ".join(str(w.message) for w in caught)
        assert "ckpt-11.pt' is damaged" in said and "ckpt-13.pt': it has no digest" in said, said
    # rank 0 looks, the others are told: a rank naming another directory gets rank 0's answer
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert fm.latest_checkpoint(d if rank == 0 else at("not-yet"), "ckpt-*.pt") == got
    with raises(TypeError, "directory must be a str", f"on rank {last}"):
        fm.latest_checkpoint(5 if rank == last else d)
    with raises(ValueError, "pattern must be a file-name pattern", "'sub/"):
        fm.latest_checkpoint(d, "sub/*.pt")
    with raises(NotADirectoryError, "is not a directory"):
        fm.latest_checkpoint(at("ckpt-10.pt"))
    fm.barrier()


if __name__ == "__main__":
    from harness import run_cases

    run_cases(globals())
