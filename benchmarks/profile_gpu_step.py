"""Where a CUDA training step's time goes, ours against DDP on NCCL, at 2 ranks: the profile
that bench_gpu_step.py's ratios need to be explained (issue 31: ours was 0.94x DDP in fp32 on
an H100, not yet profiled).

    mpiexec -n 2 python benchmarks/profile_gpu_step.py [--workload NAME] [--steps 5]
        [--trace-dir DIR]

For each variant (local, ours, ours_bf16, ddp_nccl, ddp_nccl_bf16_hook) it runs --steps steps
under torch.profiler (CPU and CUDA activities) after a warm-up, and reads the kernels of each
step off the device timeline:
- step_ms: the wall time of a step (host start to the end of its last kernel);
- nccl_ms, nccl_kernels: the NCCL kernels' total time and count per step;
- compute_ms: the other kernels' total time per step;
- first_nccl_at_ms: when the first NCCL kernel starts, from the step's first kernel (how soon
  communication overlaps backward);
- exposed_ms: from the end of the last non-NCCL kernel before the optimizer to the end of the
  last NCCL kernel (communication nobody overlaps), taken as the NCCL tail past backward's end;
- gaps_ms: device idle time within the step (no kernel of this rank running);
- timeline_step2: the second step's NCCL kernels, [start, duration] in ms from its first
  kernel, and when its last other kernel ended.
Prints one JSON line (rank 0: both ranks' figures); with --trace-dir, rank r writes one
Chrome trace per variant, gzipped, `<dir>/<workload>.<variant>.rank<r>.json.gz`.
"""

import argparse
import gzip
import os
import shutil
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gpu_step import init_ours_and_ddp, variants_for, workloads  # noqa: E402
from common import emit  # noqa: E402

import fluxmpi_py as fm  # noqa: E402

VARIANTS = ("local", "ours", "ours_bf16", "ddp_nccl", "ddp_nccl_bf16_hook")


def kernel_spans(prof):
    """(start_us, end_us, is_nccl, name) of every device kernel in the profile, by start."""
    out = []
    for evt in prof.events():
        if evt.device_type != torch.autograd.DeviceType.CUDA:
            continue
        name = evt.name
        if "memcpy" in name.lower() or "memset" in name.lower():
            continue
        tr = evt.time_range
        out.append((tr.start, tr.end, "nccl" in name.lower(), name))
    out.sort()
    return out


def step_windows(prof, label):
    """The host time range of each ``label`` record_function, in order."""
    wins = [
        (e.time_range.start, e.time_range.end)
        for e in prof.events()
        if e.name == label and e.device_type == torch.autograd.DeviceType.CPU
    ]
    wins.sort()
    return wins


def analyse(spans, windows):
    """Per-step figures (see the module's docstring), averaged over the steps."""
    rows, timeline = [], None
    for i, (start, host_end) in enumerate(windows):
        limit = windows[i + 1][0] if i + 1 < len(windows) else float("inf")
        ks = [k for k in spans if start <= k[0] < limit]
        if not ks:
            continue
        end = max(k[1] for k in ks)
        nccl = [k for k in ks if k[2]]
        other = [k for k in ks if not k[2]]
        last, gaps = ks[0][0], 0.0
        for s, e, _, _ in ks:
            if s > last:
                gaps += s - last
            last = max(last, e)
        row = {
            "step_ms": (end - start) / 1e3,
            "host_ms": (host_end - start) / 1e3,
            "nccl_ms": sum(e - s for s, e, _, _ in nccl) / 1e3,
            "nccl_kernels": len(nccl),
            "compute_ms": sum(e - s for s, e, _, _ in other) / 1e3,
            "gaps_ms": gaps / 1e3,
        }
        if nccl:
            first = ks[0][0]
            row["first_nccl_at_ms"] = (nccl[0][0] - first) / 1e3
            before = [k for k in other if k[0] < nccl[-1][0]]
            backward_end = max((k[1] for k in before), default=first)
            row["exposed_ms"] = max(0.0, nccl[-1][1] - backward_end) / 1e3
        if nccl and len(rows) == 1:  # the second step's timeline: when each NCCL kernel ran
            first = ks[0][0]
            timeline = {
                "nccl": [[round((s - first) / 1e3, 2), round((e - s) / 1e3, 2)] for s, e, _, _ in nccl],
                "compute_end_ms": round((max(k[1] for k in other) - first) / 1e3, 2) if other else None,
            }  # fmt: skip
        rows.append(row)
    if not rows:
        return {}
    keys = rows[0].keys()
    out = {k: round(sum(r.get(k, 0.0) for r in rows) / len(rows), 3) for k in keys}
    if timeline is not None:
        out["timeline_step2"] = timeline
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workload", default="resnet50_batch16_fp32")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--trace-dir", default=None)
    ap.add_argument("--port", type=int, default=29533)
    args = ap.parse_args()

    rank, world, dev = init_ours_and_ddp(args.port)
    table = workloads(False, dev)
    if args.workload not in table:
        args.workload = "resnet50_shapes_fp32"  # torchvision missing
    make_model, make_x, make_y, fp32 = table[args.workload]
    torch.manual_seed(1 + rank)
    x, y = make_x(), (make_y() if make_y else None)
    steps = variants_for(make_model, x, y, fp32)
    record = {"bench": "profile_gpu_step", "device": torch.cuda.get_device_name(dev),
              "workload": args.workload, "world": world, "variants": {}}  # fmt: skip
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    for name in VARIANTS:
        if name not in steps:
            continue
        step = steps[name]
        for _ in range(3):
            step()
        torch.cuda.synchronize(dev)
        with torch.profiler.profile(activities=acts) as prof:
            for _ in range(args.steps):
                with torch.profiler.record_function("fluxmpi_step"):
                    step()
                torch.cuda.synchronize(dev)
        mine = analyse(kernel_spans(prof), step_windows(prof, "fluxmpi_step"))
        both = fm.allgather_object(mine)
        record["variants"][name] = {f"rank{r}": v for r, v in enumerate(both)}
        if args.trace_dir:
            os.makedirs(args.trace_dir, exist_ok=True)
            path = os.path.join(args.trace_dir, f"{args.workload}.{name}.rank{rank}.json")
            prof.export_chrome_trace(path)
            with open(path, "rb") as src, gzip.open(path + ".gz", "wb") as dst:
                shutil.copyfileobj(src, dst)
            os.remove(path)
    emit("profile_gpu_step", record, rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
