"""Init with mpi4py around. Usage: init_worker.py MODE (every rank prints "rank R ok").
mpi4py_first  mpi4py initializes MPI; fm.Init adopts it; mpi4py finalizes at exit
fm_first      fm.Init initializes MPI; mpi4py is imported later; fm finalizes at exit
split         COMM_WORLD split into even and odd ranks; each half runs on its own
subset        only the even ranks call Init(comm=...); the odd ranks never use fluxmpi_py
funneled      mpi4py initializes with MPI_THREAD_FUNNELED: async requests run inline
"""

import io
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
MODE = sys.argv[1]
if MODE in ("mpi4py_first", "split", "subset", "funneled"):
    import mpi4py

    if MODE == "funneled":
        mpi4py.rc.thread_level = "funneled"
    from mpi4py import MPI

    assert MPI.Is_initialized()
import fluxmpi_py as fm  # noqa: E402


def expect_error(exc_type, fn, needle):
    try:
        fn()
    except exc_type as e:
        assert needle in str(e), str(e)
    else:
        raise AssertionError(f"expected {exc_type.__name__} with {needle!r}")


def main():
    torch.set_num_threads(1)
    if MODE == "fm_first":
        fm.Init()
        from mpi4py import MPI as late  # imported after fluxmpi_py started MPI

        assert late.Is_initialized() and late.Query_thread() == late.THREAD_MULTIPLE
        world = late.COMM_WORLD
        assert world.allreduce(1) == world.size == fm.total_workers()
        t = torch.full((4,), float(fm.local_rank() + 1))
        fm.allreduce_(t)
        n = fm.total_workers()
        assert t.tolist() == [n * (n + 1) / 2] * 4
    elif MODE == "mpi4py_first":
        world = MPI.COMM_WORLD
        fm.Init(comm=world)
        fm.Init()  # the same communicator: idempotent
        assert fm.total_workers() == world.size and fm.local_rank() == world.rank
        t = torch.full((4,), float(world.rank + 1))
        fm.allreduce_(t)
        arr = torch.full((4,), float(world.rank + 1))
        world.Allreduce(MPI.IN_PLACE, arr.numpy(), op=MPI.SUM)  # interleaved with ours
        assert torch.equal(t, arr)
        fm.barrier()
    elif MODE == "split":
        world = MPI.COMM_WORLD
        color = world.rank % 2
        sub = world.Split(color, world.rank)
        fm.Init(comm=sub)
        half = len(range(color, world.size, 2))
        assert fm.total_workers() == sub.size == half, (fm.total_workers(), half)
        assert fm.local_rank() == sub.rank == world.rank // 2
        t = torch.full((3,), float(world.rank))
        fm.allreduce_(t)
        assert t.tolist() == [float(sum(range(color, world.size, 2)))] * 3, t
        fm.bcast_(t.fill_(world.rank), root_rank=fm.total_workers() - 1)
        assert t.tolist() == [float(list(range(color, world.size, 2))[-1])] * 3
        if sub.size != world.size:
            expect_error(RuntimeError, lambda: fm.Init(comm=world), "different communicator")
        f = io.StringIO()
        fm.fluxmpi_println("half", color, file=f, ordered=True)
        if fm.local_rank() == 0:
            assert f.getvalue() == "".join(f"[{k} / {half}] half {color}\n" for k in range(half))
    elif MODE == "subset":
        world = MPI.COMM_WORLD
        even = world.rank % 2 == 0
        sub = world.Split(0 if even else MPI.UNDEFINED, world.rank)
        if not even:
            assert sub == MPI.COMM_NULL
            expect_error(ValueError, lambda: fm.Init(comm=sub), "COMM_NULL")
            expect_error(TypeError, lambda: fm.Init(comm=42), "mpi4py communicator")
            assert not fm.Initialized()
        else:
            fm.Init(comm=sub)
            t = torch.ones(5)
            fm.allreduce_(t)
            assert t.tolist() == [float(sub.size)] * 5
    elif MODE == "funneled":
        fm.Init()
        assert not fm.build_info()["thread_multiple"]
        t = torch.full((6,), float(fm.local_rank() + 1))
        req = fm.Iallreduce(t)
        assert req.test(), "with MPI_THREAD_FUNNELED the request runs inline"
        n = fm.total_workers()
        assert req.wait().tolist() == [n * (n + 1) / 2] * 6
    else:
        raise SystemExit(f"unknown mode {MODE}")
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    print(f"rank {rank} ok", flush=True)


main()
