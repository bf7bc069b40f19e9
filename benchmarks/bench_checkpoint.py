"""What the checkpoint digest costs on a 400 MB checkpoint: saving and loading with no digest,
crc32 (zlib) and sha256 (hashlib), interleaved in one process.

The checkpoint is 100 float32 tensors of 1M elements (400 MB). Each (digest, operation) pair
is timed `--reps` times in rotation, so that the page cache and the machine's load affect
every digest alike; the medians and the overhead against no digest are printed as one JSON
line and written to benchmarks/results/bench_checkpoint[_files].json.

    python benchmarks/bench_checkpoint.py           # save_checkpoint / load_checkpoint, 1 rank
    mpiexec -n 2 python benchmarks/bench_checkpoint.py   # with the broadcast on load
    python benchmarks/bench_checkpoint.py --files   # the file layer alone: write_atomic +
                                                    # torch.save, check_digest + torch.load

``--files`` loads fluxmpi_py/_util/files.py by path, so it runs without the compiled extension;
it is what the digest adds to every save and load (the rest of either is the same with or
without one). Files go to --dir (default: benchmarks/results/bench_checkpoint.tmp, removed after).
"""

import argparse
import importlib.util
import os
import shutil
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from common import emit, set_threads  # noqa: E402

DIGESTS = (None, "crc32", "sha256")


def files_module():
    spec = importlib.util.spec_from_file_location(
        "_files", os.path.join(ROOT, "fluxmpi_py", "_util", "files.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def file_layer(path, state):
    """(save, load) callables per digest: the file layer that save/load_checkpoint use."""
    files = files_module()

    def save(digest):
        files.write_atomic(path, lambda f: torch.save(state, f), durable=True, digest=digest)

    def load(digest):
        check = files.start_digest_check(path)  # as load_checkpoint: beside torch.load
        torch.load(path, map_location="cpu", weights_only=True)
        assert check() == digest

    return save, load, 0, lambda: None


def checkpoint_layer(path, state):
    sys.path.insert(0, ROOT)
    import fluxmpi_py as fm
    from fluxmpi_py.training import checkpoint

    fm.Init()
    targets = {k: torch.empty_like(v) for k, v in state.items()}

    def save(digest):
        checkpoint._DIGEST = digest  # the module's own setting: what every save writes
        fm.barrier()
        fm.save_checkpoint(path, **state)

    def load(digest):
        fm.barrier()
        fm.load_checkpoint(path, **targets)

    def done():
        checkpoint._DIGEST = "crc32"
        assert all(torch.equal(targets[k], state[k]) for k in state)

    return save, load, fm.local_rank(), done


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=400, help="checkpoint size in MB (default 400)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--files", action="store_true", help="the file layer alone (no extension)")
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    set_threads()
    torch.manual_seed(0)
    state = {f"w{i}": torch.randn(1 << 20) for i in range(args.mb // 4)}
    directory = os.path.join(args.dir or os.path.join(HERE, "results"), "bench_checkpoint.tmp")
    os.makedirs(directory, exist_ok=True)  # the same path on every rank
    path = os.path.join(directory, "ckpt.pt")
    layer = file_layer if args.files else checkpoint_layer
    save, load, rank, done = layer(path, state)
    times = {(d, op): [] for d in DIGESTS for op in ("save", "load")}
    size = 0
    try:
        for _ in range(args.reps):
            for d in DIGESTS:
                t0 = time.perf_counter()
                save(d)
                times[(d, "save")].append(time.perf_counter() - t0)
                size = max(size, os.path.getsize(path))
                t0 = time.perf_counter()
                load(d)
                times[(d, "load")].append(time.perf_counter() - t0)
        done()
    finally:
        if rank == 0:
            shutil.rmtree(directory, ignore_errors=True)
    med = {f"{d or 'none'}_{op}_s": round(statistics.median(v), 3) for (d, op), v in times.items()}
    record = {
        "bench": "checkpoint",
        "layer": "files" if args.files else "checkpoint",
        "ranks": int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1")),
        "file_bytes": size,
        "reps": args.reps,
        **med,
        **{
            f"{d}_{op}_overhead": round(med[f"{d}_{op}_s"] / med[f"none_{op}_s"] - 1, 3)
            for d in DIGESTS[1:]
            for op in ("save", "load")
        },
        "torch": torch.__version__,
    }
    emit("bench_checkpoint" + ("_files" if args.files else ""), record, rank)


if __name__ == "__main__":
    main()
