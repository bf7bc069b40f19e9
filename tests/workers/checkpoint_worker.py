"""save_checkpoint / load_checkpoint on every rank; run by tests/test_checkpoint.py (what must
not load wrong: checkpoint_damage_worker.py).

The files go to a temporary directory that rank 0 makes (all ranks run on this host) and
removes at exit, so that the worker needs no environment of its own and shares its world
size's bundled launch.
"""

import atexit
import os
import re
import shutil
import tempfile
from contextlib import contextmanager

import torch

import fluxmpi_py as fm

_DIR = None


def path_of(name):
    global _DIR
    if _DIR is None:
        made = None
        if fm.local_rank() == 0:
            made = tempfile.mkdtemp(prefix="checkpoint-worker-")
            atexit.register(shutil.rmtree, made, ignore_errors=True)
        _DIR = fm.broadcast_object(made, root_rank=0)
    return os.path.join(_DIR, name)


@contextmanager
def raises(exc, *needles):
    try:
        yield
    except exc as e:
        for n in needles:
            assert re.search(n, str(e)), f"rank {fm.local_rank()}: {n!r} not in {e!r}"
    else:
        raise AssertionError(f"rank {fm.local_rank()}: {exc.__name__} was not raised")


def flat(module_or_tensors):
    ts = (
        module_or_tensors.state_dict().values()
        if isinstance(module_or_tensors, torch.nn.Module)
        else module_or_tensors
    )
    return torch.cat([t.detach().double().reshape(-1) for t in ts])


def same_on_all_ranks(vec):
    hi, lo = vec.clone(), vec.clone()
    fm.allreduce_(hi, op="max")
    fm.allreduce_(lo, op="min")
    return torch.equal(hi, lo)


def make(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 1)
    )
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    return model, opt, sched


def train(model, opt, sched, steps, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x, y = torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        sched.step()


def opt_tensors(opt):
    sd = opt.state_dict()
    return [t for pid in sorted(sd["state"]) for _, t in sorted(sd["state"][pid].items())]


def case_round_trip_model_optimizer_scheduler():
    rank = fm.local_rank()
    model, opt, sched = make(seed=rank)  # every rank starts different
    train(model, opt, sched, steps=3 + rank, seed=rank)
    meta = {"name": "run-a", "losses": [1.0, 0.5], "t": torch.arange(5) * (rank + 1)}
    path = fm.save_checkpoint(
        path_of("round.pt"), model=model, optimizer=opt, scheduler=sched, epoch=5 + rank, meta=meta
    )
    assert os.path.exists(path)
    assert not [f for f in os.listdir(os.path.dirname(path)) if ".tmp" in f]
    if rank == 0:  # the file holds rank 0's objects
        on_disk = torch.load(path)["objects"]
        assert torch.equal(flat(on_disk["model"].values()), flat(model))
        assert on_disk["epoch"] == 5 and on_disk["scheduler"]["last_epoch"] == sched.last_epoch

    model2, opt2, sched2 = make(seed=100 + rank)  # fresh objects, different on every rank
    assert not same_on_all_ranks(flat(model2)) or fm.total_workers() == 1
    got = fm.load_checkpoint(path, model=model2, optimizer=opt2, scheduler=sched2)
    assert (
        got["epoch"] == 5 and got["meta"]["name"] == "run-a" and got["meta"]["losses"] == [1.0, 0.5]
    )
    assert torch.equal(got["meta"]["t"], torch.arange(5))
    on_disk = torch.load(path)["objects"]
    assert torch.equal(flat(model2), flat(on_disk["model"].values()))
    assert same_on_all_ranks(flat(model2))
    assert same_on_all_ranks(flat(opt_tensors(opt2)))
    assert len(opt2.state) == len(list(model2.parameters()))  # Adam state created on every rank
    assert sched2.last_epoch == on_disk["scheduler"]["last_epoch"]
    assert opt2.param_groups[0]["lr"] == on_disk["optimizer"]["param_groups"][0]["lr"]
    # Training on from the checkpoint: identical on every rank, and on rank 0 the same as
    # continuing with the objects that were saved.
    train(model2, opt2, sched2, steps=2, seed=77)
    assert same_on_all_ranks(flat(model2))
    if rank == 0:
        train(model, opt, sched, steps=2, seed=77)
        assert torch.equal(flat(model), flat(model2))


def case_overwrite_is_atomic():
    path = fm.save_checkpoint(path_of("atomic.pt"), step=1, w=torch.ones(3))
    fm.save_checkpoint(path, step=2, w=torch.full((3,), 2.0))
    assert fm.load_checkpoint(path)["step"] == 2

    real_save = torch.save

    def broken_save(obj, f, *a, **k):  # dies half-way through writing
        f.write(b"partial garbage")
        raise OSError("disk full (simulated)")

    torch.save = broken_save
    try:
        with raises(OSError, "disk full", "on rank 0"):
            fm.save_checkpoint(path, step=3, w=torch.zeros(3))
    finally:
        torch.save = real_save
    got = fm.load_checkpoint(path)  # the previous checkpoint is untouched
    assert got["step"] == 2 and torch.equal(got["w"], torch.full((3,), 2.0))
    assert not [f for f in os.listdir(os.path.dirname(path)) if ".tmp" in f]


def case_missing_file_raises_on_every_rank():
    with raises(FileNotFoundError, "nope.pt", "rank 0"):
        fm.load_checkpoint(path_of("nope.pt"))


def case_missing_directory_raises_on_every_rank():
    with raises(FileNotFoundError, "no_such_dir", "rank 0"):
        fm.save_checkpoint(os.path.join(path_of("no_such_dir"), "x.pt"), step=1)


def case_missing_entry_raises_on_every_rank():
    path = fm.save_checkpoint(path_of("entries.pt"), step=1)
    with raises(KeyError, "'model'", "entries.pt"):
        fm.load_checkpoint(path, model=torch.nn.Linear(1, 1))


def case_bad_arguments_on_one_rank_raise_on_every_rank():
    last = fm.total_workers() - 1
    with raises(TypeError, "path must be", f"rank {last}"):
        fm.save_checkpoint(123 if fm.local_rank() == last else path_of("bad.pt"), step=1)
    path = fm.save_checkpoint(path_of("bad.pt"), model=torch.nn.Linear(2, 2))
    target = "not a module" if fm.local_rank() == last else torch.nn.Linear(2, 2)
    with raises(TypeError, "model=", f"rank {last}"):
        fm.load_checkpoint(path, model=target)
    with raises(ValueError, "nothing to save"):
        fm.save_checkpoint(path)
    with raises(ValueError, "model= does not fit", "shape"):  # a model of another shape
        fm.load_checkpoint(path, model=torch.nn.Linear(3, 2))


def case_plain_torch_save_and_tensor_targets():
    path = path_of("plain.pt")
    if fm.local_rank() == 0:
        torch.save({"w": torch.arange(6.0).reshape(2, 3), "step": 9}, path)
    fm.barrier()
    w = torch.zeros(2, 3)
    got = fm.load_checkpoint(path, w=w)
    assert got["step"] == 9 and torch.equal(w, torch.arange(6.0).reshape(2, 3))


def _resumable_run(model, opt, data, first_epoch, epochs, stop=None):
    """Train; with stop=(epoch, batches), return the state to resume from at that point."""
    for epoch in range(first_epoch, epochs):
        data.set_epoch(epoch)  # the same epoch again keeps a loaded position
        consumed = 0
        for i, (x, y) in enumerate(torch.utils.data.DataLoader(data, batch_size=4)):
            if stop == (epoch, i):
                return data.state_dict(consumed=consumed)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            consumed += len(y)
    return None


def case_resume_with_distributed_optimizer_and_data():
    g = torch.Generator().manual_seed(5)
    dataset = torch.utils.data.TensorDataset(
        torch.randn(40, 3, generator=g), torch.randn(40, 1, generator=g)
    )

    def fresh():
        torch.manual_seed(11)  # same start on every rank
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
        opt = fm.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=0.05))
        return model, opt, fm.DistributedDataContainer(dataset, shuffle=True, seed=3)

    model, opt, data = fresh()  # the run that is never interrupted
    _resumable_run(model, opt, data, 0, 2)
    reference = flat(model)

    model, opt, data = fresh()  # interrupted in epoch 1 after 2 steps, checkpointed
    state = _resumable_run(model, opt, data, 0, 2, stop=(1, 2))
    path = fm.save_checkpoint(path_of("resume.pt"), model=model, optimizer=opt, data=state, epoch=1)

    model, opt, data = fresh()  # a new job: load and carry on
    got = fm.load_checkpoint(path, model=model, optimizer=opt, data=data)
    assert data.state_dict(consumed=0)["position"] == 8 and got["epoch"] == 1
    _resumable_run(model, opt, data, got["epoch"], 2)
    assert torch.equal(flat(model), reference)
    assert same_on_all_ranks(flat(model))


def draws():
    """One draw from each generator that rng=True saves."""
    import random

    import numpy as np

    return (torch.rand(3).tolist(), random.random(), float(np.random.rand()))


def case_rng_states_restored_on_each_rank():
    import random

    import numpy as np

    rank = fm.local_rank()
    torch.manual_seed(40 + rank)
    random.seed(50 + rank)
    np.random.seed(60 + rank)
    path = fm.save_checkpoint(path_of("rng.pt"), rng=True, step=1)
    expected = draws()
    for _ in range(3):
        draws()
    got = fm.load_checkpoint(path)  # rng=None: restored, the checkpoint has them
    assert got == {"step": 1}, got  # the states are not among the entries
    assert draws() == expected, f"rank {rank}: the generators were not restored"
    first = torch.tensor([expected[0][0]], dtype=torch.float64)
    assert fm.total_workers() == 1 or not same_on_all_ranks(first)  # each rank its own
    fm.load_checkpoint(path, rng=False)
    assert draws() != expected, f"rank {rank}: rng=False restored the generators"


def case_rng_required_or_for_another_world_size():
    import warnings

    plain = fm.save_checkpoint(path_of("norng.pt"), step=1)
    with raises(ValueError, "holds no random states", "rng=True", "on rank 0"):
        fm.load_checkpoint(plain, rng=True)
    other = path_of("other_world.pt")
    if fm.local_rank() == 0:  # a checkpoint written by a job of one more rank
        from fluxmpi_py._util import rng as _rng

        states = [_rng.capture()] * (fm.total_workers() + 1)
        torch.save(
            {"format": "fluxmpi_py.checkpoint", "objects": {"step": 1}, "rng": states}, other
        )
    fm.barrier()
    n = fm.total_workers()
    with raises(ValueError, f"random states of {n + 1} ranks, this job has {n}"):
        fm.load_checkpoint(other, rng=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert fm.load_checkpoint(other)["step"] == 1
    if fm.local_rank() == 0:
        assert any("they are not restored" in str(w.message) for w in caught), caught


# ---- issue 33: nothing loads wrong ---------------------------------------------------------


if __name__ == "__main__":
    from harness import run_cases

    run_cases(globals())
