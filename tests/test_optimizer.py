import os
import pickle
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import run_mpi, worker_params  # noqa: E402

# the equivalences with one process; the checks and gradient paths
WORKERS = ["optimizer_worker.py", "optimizer_checks_worker.py"]


@pytest.mark.parametrize("case", worker_params(WORKERS, [1, 2, 3], timeout=300))
def test_optimizer_multirank(case):
    case.check_passed()


def test_planner_buckets():
    # The bucket planner is pure: no Init (checked in a fresh process below).
    from fluxmpi_py._core import C

    params = [
        torch.zeros(n, dtype=dt)
        for n, dt in [
            (10, torch.float32),
            (300, torch.float32),
            (5, torch.float64),
            (20, torch.float32),
            (7, torch.float64),
        ]
    ]
    # cap 100 bytes: 25 floats; direct from 1000 bytes
    plan = C.plan_buckets(params, C.PlanOptions(cap_bytes=100, direct_min_bytes=1000))
    assert [b["members"] for b in plan] == [[1], [0], [2, 4], [3]], plan
    assert plan[0]["direct"] and not plan[1]["direct"]
    for b in plan:
        if not b["direct"] and len(b["members"]) > 1:
            esz = 8 if b["dtype"] == "Double" else 4
            assert b["numel"] * esz <= 100
    assert {b["dtype"] for b in plan} == {"Float", "Double"}
    with pytest.raises(ValueError, match="bucket cap must be positive"):
        C.plan_buckets(params, C.PlanOptions(cap_bytes=0))


def test_reducer_plan_is_the_planners():
    import fluxmpi_py as fm
    from fluxmpi_py._core import C

    fm.Init()
    params = [torch.zeros(n) for n in (10, 300, 20)]
    opts = C.PlanOptions(cap_bytes=100, direct_min_bytes=1000)
    r = C.GradientReducer(params, C.ReducerOptions(plan=opts))
    assert r.plan() == C.plan_buckets(params, opts)


def test_reducer_options_are_keyword_objects():
    from fluxmpi_py._core import C

    o = C.ReducerOptions(
        plan=C.PlanOptions(cap_bytes=100), op="avg", compression="float16", plan_hash=7
    )
    assert (o.plan.cap_bytes, o.plan.direct_min_bytes, o.op, o.compression, o.plan_hash) == (
        100,
        1 << 20,
        "average",
        "fp16",
        7,
    )
    assert repr(o) == (
        "ReducerOptions(plan=PlanOptions(cap_bytes=100, direct_min_bytes=1048576, "
        "cuda_direct_min_bytes=4611686018427387904, first_cap_bytes=0), "
        "op='average', compression='fp16', plan_hash=7)"
    )
    o.plan.cap_bytes = 200  # fields are read and written in place
    o.compression = None
    assert o == C.ReducerOptions(plan=C.PlanOptions(cap_bytes=200), plan_hash=7)
    with pytest.raises(TypeError):
        C.ReducerOptions(100)  # keywords only
    with pytest.raises(ValueError, match="unknown reduction op 'median'"):
        C.ReducerOptions(op="median")
    # compression is checked in one place, the C++ parser, whatever builds the options
    for bad in ("int8", 5):
        with pytest.raises(
            ValueError,
            match=r"DistributedOptimizer\(compression='?(int8|5)'?\): "
            r"expected None, 'fp16' or 'bf16'",
        ):
            C.ReducerOptions(compression=bad)
        with pytest.raises(ValueError, match="compression"):
            o.compression = bad


def test_distributed_optimizer_rejects_bad_compression_before_any_collective():
    import fluxmpi_py as fm

    fm.Init()
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match=r"compression='int8'"):
        fm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), compression="int8")


def test_wrapper_follows_the_wrapped_optimizers_groups_after_a_load():
    # Loading a state dict into the wrapped optimizer (synchronize_ of it, a checkpoint)
    # replaces its param_groups; an LR change through the wrapper must still reach it.
    import fluxmpi_py as fm

    fm.Init()
    model = torch.nn.Linear(2, 2)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = fm.DistributedOptimizer(sgd)
    sgd.load_state_dict(sgd.state_dict())
    for g in opt.param_groups:
        g["lr"] = 0.5
    assert [g["lr"] for g in sgd.param_groups] == [0.5]
    assert opt.state is sgd.state and opt.param_groups is sgd.param_groups
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    assert len(sgd.state) == 2  # momentum buffers, seen through the wrapper too
    assert len(opt.state) == 2
    assert opt.state_dict()["state"].keys() == sgd.state_dict()["state"].keys() == {0, 1}
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    with pytest.raises(
        TypeError, match="DistributedOptimizer cannot be pickled; save its state_dict"
    ):
        pickle.dumps(opt)


def test_planners_need_no_init(forked):
    # A fresh interpreter that never calls Init reaches both pure planners.
    code = (
        "import torch\n"
        "from fluxmpi_py._core import C\n"
        "assert not C.initialized()\n"
        "b = C.plan_buckets([torch.zeros(3)], C.PlanOptions())\n"
        "s = C.plan_broadcast([torch.zeros(3)], C.BroadcastPlanOptions())\n"
        "assert not C.initialized()\n"
        "print(len(b), len(s))\n"
    )
    out = forked.run(code, timeout=120)  # a process of its own, forked before any Init
    assert out.returncode == 0 and out.stdout.split() == ["1", "1"], out.stdout + out.stderr


@pytest.mark.parametrize("case", worker_params("freeze_worker.py", [1, 2, 3], timeout=300))
def test_freeze_and_unfreeze_after_wrapping(case):
    case.check_passed()


@pytest.mark.parametrize("case", worker_params("buffers_worker.py", [1, 2, 3], timeout=300))
def test_buffers_kept_in_sync(case):
    case.check_passed()


@pytest.mark.parametrize("np", [1, 2])
def test_docstring_examples_run(np):
    _, out = run_mpi(
        "doctest_worker.py",
        np,
        "fluxmpi_py.training.optimizer",
        "fluxmpi_py.training.buffers",
        timeout=180,
    )
    assert f"doctests passed on {np} ranks" in out, out[-4000:]
