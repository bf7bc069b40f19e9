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
