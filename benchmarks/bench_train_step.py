"""Training-step time on 2 ranks: ours against the raw-MPI limit, DDP on gloo, DDP on fluxmpi
(torch.distributed's "fluxmpi" backend), DDP with a comm hook that moves nothing (DDP's own
cost: "ddp_comm_ms" is what communication adds above it), one MPI call per tensor and no
communication, all measured in the same launch, interleaved.

    mpiexec -n 2 python benchmarks/bench_train_step.py [--quick] [--mpi4py-first] [--paired]
    python benchmarks/bench_train_step.py --import-orders [--quick] [--backoff-off]   # a driver

Prints one JSON line (rank 0): per workload, each variant's median step time in ms (the slowest
rank's median, the median over rounds that run the variants in a shuffled order) and the
ratios ours/raw_mpi, ddp/ours, and the scaling efficiency local/ours, plus how MPI waits
(build_info()["mpi_wait"]), and per workload ``cross_core_read_us`` before and after the
steps (common.cross_core_read_us: on a VM whose cores share a cache at times, the state that
the deterministic step's ratio follows, docs/measurements.md). ``--paired`` runs one step
of each variant in turn instead (the step times then are medians over every step) and adds,
per ratio, the median over the cycles of each step over its peer's step in the same cycle,
with its range. ``--mpi4py-first`` imports mpi4py, which starts MPI, before fluxmpi_py (the
order ``Init(comm=...)`` needs). ``--import-orders`` launches both orders on 2 ranks,
alternating, on ResNet-50 shapes, and prints them side by side in one JSON line; with
``--backoff-off`` each order runs also with FLUXMPI_WAIT_BACKOFF=off (the backoff to sleeping
in long waits off) instead of the polling launches.
"""

import argparse
import json
import os
import random
import subprocess
import sys

import torch
import torch.nn as nn

if "--mpi4py-first" in sys.argv:
    from mpi4py import MPI  # noqa: F401  (starts MPI before fluxmpi_py is imported)
USER_ENV = dict(os.environ)  # before `import fluxmpi_py` adds its Open MPI setting

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (  # noqa: E402
    cross_core_read_us,
    emit,
    median_time,
    paired_ratios,
    paired_times,
    resnet50_param_shapes,
    set_threads,
)

import fluxmpi_py as fm  # noqa: E402
from fluxmpi_py.training import _exact_shards  # noqa: E402


class ShapesModel(nn.Module):
    """Trivial compute over ResNet-50's 161 parameter shapes: backward + step dominate."""

    def __init__(self, shapes, scale=1.0):
        super().__init__()
        self.ps = nn.ParameterList([nn.Parameter(torch.randn(s) * 0.01) for s in shapes])
        self.ws = [torch.randn(s) for s in shapes]

    def forward(self, x):
        return sum((p * w).sum() for p, w in zip(self.ps, self.ws)) * x.mean()


class SmallConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(64, 128, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(128, 10),
        )

    def forward(self, x):
        return self.f(x)


def wide_mlp():
    return nn.Sequential(
        nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 10)
    )


def workloads(quick):
    shapes = resnet50_param_shapes(4 if quick else 1)
    return {
        "resnet50_shapes": (lambda: ShapesModel(shapes), lambda: torch.ones(2), None),
        "small_convnet": (
            SmallConvNet,
            lambda: torch.randn(32, 3, 32, 32),
            lambda: torch.randint(0, 10, (32,)),
        ),
        "wide_mlp": (wide_mlp, lambda: torch.randn(64, 1024), lambda: torch.randint(0, 10, (64,))),
    }


def loss_of(model, x, y):
    out = model(x)
    return out if y is None else nn.functional.cross_entropy(out, y)


def train_steps(make_model, x, y, comm, size, gloo, wanted=()):
    """One training step on (x, y) per variant, each with its own model and optimizer; DDP on
    gloo runs over the process group `gloo`. Returns the steps by name, and our model and
    optimizer (for their statistics). `wanted`: where given, the deterministic and k > 1
    variants outside it are not built (their buffers are large)."""
    from mpi4py import MPI  # imported by main after fm.Init

    variants = {}

    # no communication: each rank trains alone (the compute baseline)
    m0 = make_model()
    o0 = torch.optim.SGD(m0.parameters(), lr=1e-3, momentum=0.9)

    def local():
        o0.zero_grad()
        loss_of(m0, x, y).backward()
        o0.step()

    variants["local"] = local

    # ours
    m1 = make_model()
    o1 = fm.DistributedOptimizer(torch.optim.SGD(m1.parameters(), lr=1e-3, momentum=0.9))

    def ours():
        o1.zero_grad()
        loss_of(m1, x, y).backward()
        o1.step()

    variants["ours"] = ours

    # ours with deterministic=True (exact sums, the same bits at any world size), and both
    # with two and four backward passes (micro-batches) per step; "_int64": through the int64
    # path (the sharded float path's baseline, the same bits; k > 1 took it until issue 48's
    # one exchange a step of all k passes' values)
    for label, det, k in (
        ("ours_deterministic", True, 1),
        ("ours_deterministic_int64", True, 1),
        ("ours_k2", False, 2),
        ("ours_deterministic_k2", True, 2),
        ("ours_deterministic_int64_k2", True, 2),
        ("ours_k4", False, 4),
        ("ours_deterministic_k4", True, 4),
        ("ours_deterministic_int64_k4", True, 4),
    ):
        if wanted and label not in wanted:
            continue
        md = make_model()
        most = _exact_shards.SHARDED_MAX_PASSES
        _exact_shards.SHARDED = "_int64" not in label
        _exact_shards.SHARDED_MAX_PASSES = 4  # "ours_deterministic_k4": the sharded path
        od = fm.DistributedOptimizer(
            torch.optim.SGD(md.parameters(), lr=1e-3, momentum=0.9),
            deterministic=det,
            backward_passes_per_step=k,
        )
        _exact_shards.SHARDED = True
        _exact_shards.SHARDED_MAX_PASSES = most

        def step(md=md, od=od, k=k):
            od.zero_grad()
            for _ in range(k):
                loss_of(md, x, y).backward()
            od.step()

        variants[label] = step

    # raw MPI in-place allreduce on pre-made 25 MiB buckets (no copies, no averaging): the limit
    m2 = make_model()
    o2 = torch.optim.SGD(m2.parameters(), lr=1e-3, momentum=0.9)
    total = sum(p.numel() for p in m2.parameters())
    cap = (25 << 20) // 4
    bufs = [torch.zeros(min(cap, total - i)) for i in range(0, total, cap)]

    def raw_mpi():
        o2.zero_grad()
        loss_of(m2, x, y).backward()
        for b in bufs:
            comm.Allreduce(MPI.IN_PLACE, b.numpy(), op=MPI.SUM)
        o2.step()

    variants["raw_mpi"] = raw_mpi

    # one MPI call per gradient tensor (in place), then average
    m3 = make_model()
    o3 = torch.optim.SGD(m3.parameters(), lr=1e-3, momentum=0.9)

    def per_tensor():
        o3.zero_grad()
        loss_of(m3, x, y).backward()
        for p in m3.parameters():
            comm.Allreduce(MPI.IN_PLACE, p.grad.numpy(), op=MPI.SUM)
            p.grad.div_(size)
        o3.step()

    variants["per_tensor_mpi"] = per_tensor

    # DDP on gloo and on fluxmpi (the default group): plain, with gradient_as_bucket_view, and
    # with 1 MB buckets (bucket_cap_mb=1, and the bucket view)
    ddps = (
        ("ddp_gloo", gloo, False, 25),
        ("ddp_gloo_bucket_view", gloo, True, 25),
        ("ddp_gloo_1mb", gloo, True, 1),
        ("ddp_fluxmpi", None, False, 25),
        ("ddp_fluxmpi_bucket_view", None, True, 25),
        ("ddp_fluxmpi_1mb", None, True, 1),
    )
    for label, group, view, cap in ddps:
        base = make_model()
        ddp = nn.parallel.DistributedDataParallel(
            base,
            process_group=group,
            gradient_as_bucket_view=view,
            bucket_cap_mb=cap,
            broadcast_buffers=False,
        )
        od = torch.optim.SGD(ddp.parameters(), lr=1e-3, momentum=0.9)

        def ddp_step(ddp=ddp, od=od):
            od.zero_grad()
            loss_of(ddp, x, y).backward()
            od.step()

        variants[label] = ddp_step

    # DDP's own cost: the same DDP (on fluxmpi) with a comm hook that moves nothing and returns
    # the bucket at once. What a step costs above this is the communication and its waits.
    def no_comm(state, bucket):
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    for label, view in (("ddp_no_comm", False), ("ddp_no_comm_bucket_view", True)):
        ddp = nn.parallel.DistributedDataParallel(
            make_model(), gradient_as_bucket_view=view, broadcast_buffers=False
        )
        ddp.register_comm_hook(None, no_comm)
        od = torch.optim.SGD(ddp.parameters(), lr=1e-3, momentum=0.9)

        def ddp_step(ddp=ddp, od=od):
            od.zero_grad()
            loss_of(ddp, x, y).backward()
            od.step()

        variants[label] = ddp_step
    return variants, m1, o1


def import_orders(args):
    """Launch both import orders on 2 ranks, alternating `--pairs` times; emit them side by
    side (per order: the median over launches of each variant's step ms). A third order,
    mpi4py first with OMPI_MCA_mpi_yield_when_idle=0, shows what busy-polling costs; with
    --backoff-off, each order with FLUXMPI_WAIT_BACKOFF=off instead shows what the backoff costs."""
    settings = {"fluxmpi_py_first": {}, "mpi4py_first": {}}
    if args.backoff_off:  # each order also with the backoff to sleeping off: what it costs
        settings.update({o + "_backoff_off": {"FLUXMPI_WAIT_BACKOFF": "off"} for o in settings})
    else:
        settings["mpi4py_first_polling"] = {"OMPI_MCA_mpi_yield_when_idle": "0"}
    orders = {order: [] for order in settings}
    for _ in range(args.pairs):
        for order, runs in orders.items():
            env = dict(USER_ENV, **settings[order])
            cmd = ["mpiexec", "-n", "2", "--oversubscribe", sys.executable, __file__]
            cmd += ["--workloads", "resnet50_shapes", "--port", str(args.port)]
            cmd += ["--quick"] if args.quick else []
            cmd += ["--mpi4py-first"] if order.startswith("mpi4py_first") else []
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
            runs.append(json.loads(out.strip().splitlines()[-1]))
    result = {"bench": "train_step_import_order", "launches_per_order": args.pairs}
    for order, runs in orders.items():
        recs = [r["workloads"]["resnet50_shapes"] for r in runs]
        ms = {k: sorted(r["step_ms"][k] for r in recs)[len(recs) // 2] for k in recs[0]["step_ms"]}
        result[order] = {
            "mpi_wait": runs[0]["mpi_wait"],
            "step_ms": ms,
            "ours_over_raw_mpi": round(ms["ours"] / ms["raw_mpi"], 3),
            "ddp_gloo_over_ours": round(ms["ddp_gloo"] / ms["ours"], 3),
            "ours_over_raw_mpi_per_launch": [r["ours_over_raw_mpi"] for r in recs],
        }
    name = "bench_train_step_backoff" if args.backoff_off else "bench_train_step_import_order"
    emit(name, result, 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="small sizes, few reps (a smoke test)")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--port", type=int, default=29517)
    ap.add_argument("--mpi4py-first", action="store_true", help="start MPI before fluxmpi_py")
    ap.add_argument("--workloads", default="", help="comma-separated names (default: all)")
    ap.add_argument("--variants", default="", help="comma-separated names (default: all)")
    ap.add_argument(
        "--paired",
        action="store_true",
        help="one step of each variant in turn (not --reps steps of one, then the next); adds "
        "each ratio's median over the cycles (each step over its peer's step in the same cycle)",
    )
    ap.add_argument("--import-orders", action="store_true", help="both orders, side by side")
    ap.add_argument("--pairs", type=int, default=3, help="--import-orders: launches per order")
    ap.add_argument(
        "--backoff-off",
        action="store_true",
        help="--import-orders: each order with FLUXMPI_WAIT_BACKOFF=off beside it (no polling)",
    )
    args = ap.parse_args()
    if args.import_orders:
        return import_orders(args)
    set_threads()
    fm.Init()
    import torch.distributed as dist
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = fm.local_rank(), fm.total_workers()
    dist.init_process_group("fluxmpi")  # rank and size from MPI
    gloo = dist.new_group(backend="gloo")  # beside it, on the same ranks
    reps = args.reps or (3 if args.quick else 15)
    rounds = 1 if args.quick else 3
    result = {
        "bench": "train_step",
        "ranks": size,
        "threads_per_rank": torch.get_num_threads(),
        "torch": torch.__version__,
        "mpi": fm.build_info()["mpi_library"].split(",")[0],
        "import_order": "mpi4py_first" if args.mpi4py_first else "fluxmpi_py_first",
        "mpi_wait": fm.build_info()["mpi_wait"],
        "workloads": {},
    }

    wanted = set(filter(None, args.workloads.split(",")))
    for name, (make_model, make_x, make_y) in workloads(args.quick).items():
        if wanted and name not in wanted:
            continue
        torch.manual_seed(0)
        x, y = make_x(), (make_y() if make_y else None)
        chosen = set(filter(None, args.variants.split(",")))
        variants, m1, o1 = train_steps(make_model, x, y, comm, size, gloo, chosen)
        if args.variants:
            variants = {k: v for k, v in variants.items() if k in args.variants.split(",")}

        probe = [cross_core_read_us(comm, MPI)]  # the VM's state, before and after
        times = {k: [] for k in variants}
        order = list(variants)
        rng = random.Random(len(name))  # the same order on every rank
        for _ in range(rounds):  # interleave so that drift hits every variant alike
            rng.shuffle(order)  # and no variant always follows the same one
            if args.paired:  # every step, the slowest rank's
                cycles = paired_times({k: variants[k] for k in order}, reps, sync=comm.Barrier)
                for k, t in cycles.items():
                    times[k] += [max(step) for step in zip(*comm.allgather(t))]
                continue
            for k in order:
                # the slowest rank's median: "local" too, where each rank trains alone
                t = median_time(variants[k], reps, warmup=2, sync=comm.Barrier)
                times[k].append(comm.allreduce(t, op=MPI.MAX))
        probe.append(cross_core_read_us(comm, MPI))
        ms = {k: round(1000 * sorted(v)[len(v) // 2], 2) for k, v in times.items()}
        rec = ratios(ms) if args.variants else full_record(ms)
        if args.paired:  # each ratio's median over the cycles, its lowest and highest
            rec["paired"] = {
                f"{a}_over_{b}": [round(x, 3) for x in r]
                for (a, b), r in paired_ratios(times, RATIO_PAIRS).items()
            }
        rec |= {
            "cross_core_read_us": probe,
            "buckets": len(o1.buckets),
            "launched_during_backward": o1._reducer.launched_early,
            "params": sum(p.numel() for p in m1.parameters()),
        }
        result["workloads"][name] = rec
        del variants
    dist.destroy_process_group()
    # a selection (the import-order driver's launches) leaves the full results file alone
    selected = wanted or args.variants
    emit("bench_train_step" + ("_selected" if selected else ""), result, rank)


#: deterministic=True over the default at k = 1, 2 and 4 passes (both paths), and the sharded
#: path over the int64 one
RATIO_PAIRS = (
    ("ours_deterministic", "ours"),
    ("ours_deterministic_int64", "ours"),
    ("ours_deterministic", "ours_deterministic_int64"),
    ("ours_deterministic_k2", "ours_k2"),
    ("ours_deterministic_int64_k2", "ours_k2"),
    ("ours_deterministic_k4", "ours_k4"),
    ("ours_deterministic_int64_k4", "ours_k4"),
)


def ratios(ms):
    """The step times, and the ratios of :data:`RATIO_PAIRS`."""
    rec = {"step_ms": ms}
    for det, base in RATIO_PAIRS:
        if det in ms and base in ms:
            rec[f"{det}_over_{base}"] = round(ms[det] / ms[base], 3)
    return rec


def full_record(ms):
    """Every ratio of the full run (all variants)."""
    return ratios(ms) | {
        "ours_over_raw_mpi": round(ms["ours"] / ms["raw_mpi"], 3),
        "ddp_gloo_over_ours": round(ms["ddp_gloo"] / ms["ours"], 3),
        "ddp_gloo_bucket_view_over_ours": round(ms["ddp_gloo_bucket_view"] / ms["ours"], 3),
        "ddp_gloo_over_ddp_fluxmpi": round(ms["ddp_gloo"] / ms["ddp_fluxmpi"], 3),
        "ddp_gloo_over_ddp_fluxmpi_1mb": round(ms["ddp_gloo"] / ms["ddp_fluxmpi_1mb"], 3),
        "ddp_fluxmpi_1mb_over_ours": round(ms["ddp_fluxmpi_1mb"] / ms["ours"], 3),
        "ddp_fluxmpi_over_ours": round(ms["ddp_fluxmpi"] / ms["ours"], 3),
        "ddp_fluxmpi_bucket_view_over_ours": round(ms["ddp_fluxmpi_bucket_view"] / ms["ours"], 3),
        "per_tensor_over_ours": round(ms["per_tensor_mpi"] / ms["ours"], 3),
        # what communication adds to a DDP step, over DDP with a hook that moves nothing
        "ddp_comm_ms": {
            "gloo": round(ms["ddp_gloo"] - ms["ddp_no_comm"], 2),
            "fluxmpi": round(ms["ddp_fluxmpi"] - ms["ddp_no_comm"], 2),
            "gloo_bucket_view": round(
                ms["ddp_gloo_bucket_view"] - ms["ddp_no_comm_bucket_view"], 2
            ),
            "fluxmpi_bucket_view": round(
                ms["ddp_fluxmpi_bucket_view"] - ms["ddp_no_comm_bucket_view"], 2
            ),
            "ours": round(ms["ours"] - ms["local"], 2),
        },
        "scaling_efficiency": round(ms["local"] / ms["ours"], 3),
    }


if __name__ == "__main__":
    main()
