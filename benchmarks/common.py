"""Shared pieces of the benchmarks: ResNet-50's parameter shapes, timing, JSON output."""

import json
import os
import statistics
import time

import torch


def resnet50_param_shapes(width_div=1):
    """The 161 parameter shapes of torchvision's ResNet-50 (25.6M floats at width_div=1), in
    registration order: convs without bias, batch-norm weight and bias, then the classifier."""
    w = lambda c: max(1, c // width_div)  # noqa: E731
    shapes = [(w(64), 3, 7, 7), (w(64),), (w(64),)]
    inplanes = w(64)
    for planes, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        planes = w(planes)
        for b in range(blocks):
            shapes += [
                (planes, inplanes, 1, 1),
                (planes,),
                (planes,),
                (planes, planes, 3, 3),
                (planes,),
                (planes,),
                (planes * 4, planes, 1, 1),
                (planes * 4,),
                (planes * 4,),
            ]
            if b == 0:
                shapes += [(planes * 4, inplanes, 1, 1), (planes * 4,), (planes * 4,)]
            inplanes = planes * 4
    shapes += [(1000, inplanes), (1000,)]
    assert len(shapes) == 161
    return shapes


def median_time(fn, reps, warmup=2, sync=None):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if sync:
            sync()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def paired_times(fns, reps, warmup=2, sync=None):
    """One step of each of ``fns`` (name -> callable) in turn, ``reps`` times: name -> the
    ``reps`` times in seconds. Step i of every function runs within one cycle, so a ratio of
    two functions' step i (``paired_ratios``) compares them at the same moment: a machine
    that shifts between levels of speed shifts both alike."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            if sync:
                sync()
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


def paired_ratios(times, pairs):
    """``pairs``: (a, b) names of ``times`` (name -> the step times of one cycle after
    another, as ``paired_times`` gives them); (a, b) -> the median of a's step over b's step
    in the same cycle, with the lowest and highest of those ratios."""
    out = {}
    for a, b in pairs:
        if a in times and b in times:
            r = sorted(x / y for x, y in zip(times[a], times[b]))
            out[(a, b)] = (statistics.median(r), r[0], r[-1])
    return out


def cross_core_read_us(comm, mpi, reps=40, nbytes=2 << 20):
    """[us to copy out `nbytes` that another rank of this host has just written into shared
    memory, us to copy out `nbytes` this rank has just written itself], medians of `reps`,
    measured on the host's second rank (`mpi`: mpi4py's MPI), each of the two ranks held to
    its own core meanwhile; None on a host of one rank. On
    the 2-core VM of docs/measurements.md the first is at times about the second and at times
    1.8-1.9x it, and the deterministic step's ratio to the default follows (issue 48)."""
    host = comm.Split_type(mpi.COMM_TYPE_SHARED)
    rank, n = host.Get_rank(), nbytes // 4
    if host.Get_size() < 2:
        host.Free()
        return None
    cpus = sorted(os.sched_getaffinity(0))  # the two ranks on two cores while probing
    os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
    win = mpi.Win.Allocate_shared(nbytes if rank == 0 else 0, 4, comm=host)
    buf, _ = win.Shared_query(0)
    shared = torch.frombuffer(buf, dtype=torch.float32, count=n)
    src, own, dst = torch.ones(n), torch.zeros(n), torch.zeros(n)
    times = ([], [])
    for _ in range(reps):
        host.Barrier()
        if rank == 0:
            shared.copy_(src)
        host.Barrier()
        if rank == 1:
            for written, out in ((shared, times[0]), (own, times[1])):
                if written is own:
                    own.copy_(src)
                t0 = time.perf_counter()
                dst.copy_(written)
                out.append(time.perf_counter() - t0)
        host.Barrier()
    del shared
    win.Free()
    os.sched_setaffinity(0, cpus)
    us = [round(1e6 * statistics.median(t)) for t in times] if rank == 1 else None
    us = host.bcast(us, root=1)
    host.Free()
    return us


def emit(name, record, rank):
    if rank != 0:
        return
    line = json.dumps(record, sort_keys=False)
    print(line, flush=True)
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{name}.json"), "w") as f:
        f.write(line + "\n")


def set_threads():
    torch.set_num_threads(1)
