"""allreduce_ across virtual hosts on this machine, over links shaped like a network.

    sudo .venv/bin/python benchmarks/multi_host.py            # every layout, link and size
    sudo .venv/bin/python benchmarks/multi_host.py --quick    # fewer sizes and repetitions

Makes 2 or 3 virtual hosts (tests/virtual_hosts.py: network namespaces joined by TCP through
a bridge), shapes every host's link with tc netem (a rate and a one-way delay; the rate alone with tc
tbf where the kernel lacks netem), and runs
benchmarks/multi_host_worker.py on each layout (hosts x ranks per host), timing each allreduce
algorithm (MPI_Allreduce, fluxmpi's ring, the node-aware path, and the default choice). Writes
benchmarks/results/multi_host.json (--quick: multi_host.quick.json) and prints a Markdown
table. Needs root (network namespaces). Every rank shares this machine's cores: the absolute
times include that contention, the links add the network's.
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
import virtual_hosts  # noqa: E402
from mpi_util import mpi_env  # noqa: E402

LINKS = [(10, 50), (1, 200)]  # Gbit/s, one-way delay (us)
LAYOUTS = [(2, 2), (2, 1), (3, 1)]  # hosts x ranks per host
SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20]
QUICK_SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20]


def run_layout(cluster, per_host, sizes, reps, timeout):
    rc, out, timed_out = cluster.mpiexec(
        [sys.executable, os.path.join(HERE, "multi_host_worker.py")]
        + [",".join(map(str, sizes)), str(reps)],
        per_host,
        timeout,
        env=mpi_env(),
    )
    if rc != 0 or timed_out:
        raise SystemExit(f"the benchmark job failed (exit {rc}, timed out {timed_out}):\n{out}")
    return [
        json.loads(line[len("RESULT ") :])
        for line in out.splitlines()
        if line.startswith("RESULT ")
    ]


def table(rows):
    algos = ["mpi", "ring", "hierarchical", "auto"]
    lines = [
        "| link | hosts x ranks | bytes | " + " | ".join(algos) + " | auto took |",
        "|---|---|---|" + "---|" * (len(algos) + 1),
    ]
    for r in rows:
        best = min(algos[:3], key=lambda a: r[a])
        took = r["auto took"]
        cells = [f"**{r[a]:.0f}**" if a == best else f"{r[a]:.0f}" for a in algos]
        lines.append(
            f"| {r['link']} | {r['hosts']} x {r['per_host']} | {r['bytes']:,} | "
            + " | ".join(cells)
            + f" | {took} |"
        )
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--layouts", default=None, help="e.g. 2x2,3x1 (default: all)")
    ap.add_argument("--sizes", default=None, help="bytes, comma-separated")
    ap.add_argument("--out", default=None, help="the JSON file (default under results/)")
    args = ap.parse_args()
    reason = virtual_hosts.unavailable_reason()
    if reason:
        raise SystemExit(f"no virtual hosts: {reason}")
    sizes = QUICK_SIZES if args.quick else SIZES
    if args.sizes:
        sizes = [int(x) for x in args.sizes.split(",")]
    layouts = LAYOUTS
    if args.layouts:
        layouts = [tuple(int(x) for x in lay.split("x")) for lay in args.layouts.split(",")]
    reps = args.reps or (3 if args.quick else 5)
    links = LINKS[:1] if args.quick else LINKS
    rows = []
    for hosts in sorted({h for h, _ in layouts}):
        with virtual_hosts.VirtualCluster(hosts=hosts) as cluster:
            for gbit, delay in links:
                link = cluster.shape(gbit=gbit, delay_us=delay)
                for h, per_host in layouts:
                    if h != hosts:
                        continue
                    for row in run_layout(cluster, per_host, sizes, reps, timeout=900):
                        row.update(link=link, hosts=hosts, per_host=per_host)
                        rows.append(row)
                        print(json.dumps(row), flush=True)
    out = os.path.join(
        HERE, "results", "multi_host.quick.json" if args.quick else "multi_host.json"
    )
    with open(out, "w") as f:
        json.dump(rows, f, indent=1)
    print(table(rows))


if __name__ == "__main__":
    main()
