"""``python -m fluxmpi_py.flight DIR``: merge the flight recorder's dumps and say where the
ranks parted.

Each rank writes ``DIR/fluxmpi_flight.<rank>.json`` (its last N blocking collectives:
fluxmpi_py/runtime/recorder.py, csrc/runtime/flight.h) on the stall timeout, an abort or
SIGTERM/SIGINT, when ``Init(flight_dir=DIR)`` or ``FLUXMPI_FLIGHT_DIR=DIR`` names the
directory. This reads them all and prints, per group of calls (the world, each sub-group):
the last call every rank completed, the first call where the ranks differ (a rank still
inside it, a rank that never entered it, or ranks in calls of different kinds or names), and
which rank was slowest to arrive over the calls they completed together. A rank's arrival
lag at a call is how much less it waited in it than the rank that waited longest: every rank
leaves a collective together, so waits compare without synchronized clocks.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
from collections.abc import Sequence

_NAME = re.compile(r"fluxmpi_flight\.(\d+)\.json$")


def load(directory: str) -> dict[int, dict]:
    """Every rank's dump in ``directory``, by rank. A file that cannot be read is skipped
    with a note on stderr (a rank killed while writing leaves none: dumps are renamed into
    place whole)."""
    dumps: dict[int, dict] = {}
    for path in sorted(glob.glob(os.path.join(directory, "fluxmpi_flight.*.json"))):
        m = _NAME.search(path)
        if m is None:
            continue
        try:
            with open(path, encoding="utf-8") as f:
                dumps[int(m.group(1))] = json.load(f)
        except (OSError, ValueError) as e:
            print(f"fluxmpi_py.flight: skipping {path}: {e}", file=sys.stderr)
    return dumps


def _label(rec: dict) -> str:
    """'#18 allreduce (of allreduce_() at train.py:42)'"""
    out = f"#{rec['number']} {rec['kind'] or 'collective'}"
    return out + (f" (of {rec['call']})" if rec["call"] else "")


def _same(a: dict, b: dict) -> bool:
    return a["kind"] == b["kind"] and a["call"] == b["call"]


def _ms(us: float) -> str:
    return f"{us / 1e3:.3f} ms" if us < 1e6 else f"{us / 1e6:.1f} s"


def parting(dumps: dict[int, dict], group: int) -> dict:
    """Where the ranks with records on ``group`` parted: ``last_common`` (the record of the
    last call every rank completed, the same on each, or None), ``at`` (the first number where
    they differ, or None) and ``ranks``: for each rank, its record at ``at`` (None: never
    entered) and its last record on the group."""
    by_rank = {
        r: {rec["number"]: rec for rec in d["records"] if rec["group"] == group}
        for r, d in dumps.items()
    }
    by_rank = {r: recs for r, recs in by_rank.items() if recs}
    first = max(min(recs) for recs in by_rank.values())
    last = max(max(recs) for recs in by_rank.values())
    last_common, at = None, None
    for n in range(first, last + 1):
        recs = [x for x in (by_rank[r].get(n) for r in by_rank) if x is not None]
        done = len(recs) == len(by_rank) and all(x["end_us"] is not None for x in recs)
        if done and all(_same(recs[0], x) for x in recs):
            last_common = recs[0]
        else:
            at = n
            break
    return {
        "group": group,
        "last_common": last_common,
        "at": at,
        "ranks": {
            r: {"at": recs.get(at) if at is not None else None, "last": recs[max(recs)]}
            for r, recs in by_rank.items()
        },
    }


def arrival_lags(dumps: dict[int, dict], group: int, last: int | None = None) -> dict:
    """Over the calls on ``group`` that every rank completed in the same call (the last
    ``last`` of them, or all): per rank its mean and max arrival lag (microseconds) and how
    often it arrived last. ``calls``: how many calls that covers."""
    by_rank = {
        r: {
            rec["number"]: rec
            for rec in d["records"]
            if rec["group"] == group and rec["end_us"] is not None
        }
        for r, d in dumps.items()
    }
    by_rank = {r: recs for r, recs in by_rank.items() if recs}
    common = sorted(set.intersection(*(set(recs) for recs in by_rank.values())))
    common = [
        n for n in common if all(_same(by_rank[r][n], by_rank[min(by_rank)][n]) for r in by_rank)
    ]
    if last is not None:
        common = common[-last:] if last > 0 else []
    lags: dict[int, list[int]] = {r: [] for r in by_rank}
    last_in = dict.fromkeys(by_rank, 0)
    for n in common:
        waits = {r: by_rank[r][n]["end_us"] - by_rank[r][n]["start_us"] for r in by_rank}
        longest = max(waits.values())
        for r, w in waits.items():
            lags[r].append(longest - w)
        last_in[min(waits, key=lambda r: (waits[r], r))] += 1
    return {
        "calls": len(common),
        "ranks": {
            r: {
                "mean_us": sum(v) / len(v) if v else 0.0,
                "max_us": max(v) if v else 0,
                "last": last_in[r],
            }
            for r, v in lags.items()
        },
    }


def _where(rank: int, info: dict, at: int, dump: dict) -> str:
    rec, last = info["at"], info["last"]
    head = f"  rank {rank}: "
    if rec is None:
        since = dump["time_us"] - (last["end_us"] or last["start_us"])
        state = "completed" if last["end_us"] is not None else "still inside"
        return head + (
            f"never entered #{at}; its last call on the group: {_label(last)}, {state} "
            f"{_ms(since)} before its dump"
        )
    if rec["end_us"] is None:
        return head + f"inside {_label(rec)} for {_ms(dump['time_us'] - rec['start_us'])}"
    return head + f"completed {_label(rec)}"


def report(dumps: dict[int, dict], last: int | None = None) -> str:
    """The text ``python -m fluxmpi_py.flight`` prints."""
    size = max(d["size"] for d in dumps.values())
    missing = [r for r in range(size) if r not in dumps]
    lines = [
        f"fluxmpi_py flight recorder: dumps of {len(dumps)} of {size} ranks"
        + (
            f" (none from rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))})"
            if missing
            else ""
        )
    ]
    for r, d in sorted(dumps.items()):
        why = f": {d['why'].splitlines()[0]}" if d.get("why") else ""
        lines.append(f"  rank {r}: {d['reason']}, {len(d['records'])} calls kept{why}")
    groups = sorted({rec["group"] for d in dumps.values() for rec in d["records"]})
    for g in groups:
        name = "world" if g == 0 else f"group {g}"
        p = parting(dumps, g)
        if p["last_common"] is not None:
            lines.append(f"{name}: the last call every rank completed: {_label(p['last_common'])}")
        else:
            lines.append(f"{name}: no call that every rank completed among those kept")
        if p["at"] is None:
            lines.append(f"{name}: the ranks did not part (every call kept is the same on each)")
        else:
            lines.append(f"{name}: the ranks parted at call #{p['at']}:")
            for r, info in sorted(p["ranks"].items()):
                lines.append(_where(r, info, p["at"], dumps[r]))
        lag = arrival_lags(dumps, g, last)
        if lag["calls"] and len(lag["ranks"]) > 1:
            lines.append(
                f"{name}: arrival lag over the last {lag['calls']} calls completed together "
                "(how much later than the first rank each arrived):"
            )
            for r, v in sorted(lag["ranks"].items()):
                lines.append(
                    f"  rank {r}: mean {_ms(v['mean_us'])}, max {_ms(v['max_us'])}, "
                    f"arrived last in {v['last']} of {lag['calls']}"
                )
            slowest = max(lag["ranks"], key=lambda r: (lag["ranks"][r]["mean_us"], -r))
            lines.append(f"{name}: slowest to arrive: rank {slowest}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fluxmpi_py.flight",
        description="Merge the flight recorder's dumps (fluxmpi_flight.<rank>.json) and show "
        "where the ranks parted and which rank was slowest to arrive.",
    )
    parser.add_argument(
        "directory", help="the directory Init(flight_dir=) or FLUXMPI_FLIGHT_DIR named"
    )
    parser.add_argument(
        "--last",
        type=int,
        default=None,
        metavar="N",
        help="arrival lags over the last N calls only",
    )
    args = parser.parse_args(argv)
    if not os.path.isdir(args.directory):
        print(f"fluxmpi_py.flight: {args.directory}: not a directory", file=sys.stderr)
        return 2
    dumps = load(args.directory)
    if not dumps:
        print(
            f"fluxmpi_py.flight: no fluxmpi_flight.<rank>.json in {args.directory}",
            file=sys.stderr,
        )
        return 1
    print(report(dumps, args.last))
    return 0


if __name__ == "__main__":
    sys.exit(main())
