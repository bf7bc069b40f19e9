"""``python -m fluxmpi_py.reproduce SCRIPT --ranks 1,2,4 --steps N [-- ARGS]``: the same bits?

Runs ``SCRIPT ARGS`` once per world size of ``--ranks`` (a size may repeat: ``1,2,2``), each
through ``python -m fluxmpi_py.run``'s launcher (``mpiexec -n W python SCRIPT ARGS``), one after
another. The script calls ``fm.record_step({"model": model, "optimizer": opt})`` after each step
(:func:`fluxmpi_py.record_step`): rank 0 writes a digest of every parameter, buffer, optimizer
state tensor and setting, and the N-th step ends the run. Then the runs are compared step by
step: the first step whose digests differ is named, with the first tensor that differs, the
runs that differ and those that agree; after the last step the saved tensors are compared with
``torch.equal``, with the largest difference of each run's first differing tensor.

Exit status: 0 when every run has the same bits at every step, 1 when they differ, 2 when a
run failed (its status is shown; its output went by as it ran) or recorded fewer than N steps.

Options (before the script):
    --ranks LIST        comma-separated world sizes, in the order to run them (required)
    --steps N           the steps to record and compare; the N-th ends each run (required)
    --timeout SECONDS   a run still going after this long is ended (default: none)
    --mpiexec PATH      the mpiexec to run (default: as python -m fluxmpi_py.run's)
    --mpiexec-args STR  more words for mpiexec, e.g. "--oversubscribe" (shell-quoted)
    --python CMD        the interpreter the ranks run the script with (shell-quoted; default:
                        this one), e.g. "apptainer exec img.sif python3" on a cluster
    --out DIR           keep each run's records in DIR/run<i>-np<W> (default: a temporary folder)

The bits depend on the script, not only on fluxmpi_py: same-bits training needs
``DistributedOptimizer(deterministic=True)``, ``DistributedSampler(global_batch_size=G,
micro_batch_size=m)`` and one intra-op thread count at every size (each run's count is shown;
set ``OMP_NUM_THREADS``). docs/sections/40-optimizer.md#the-same-bits-at-any-world-size.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import tempfile
from dataclasses import dataclass, field

import torch

from .run import RunOptions, _is_open_mpi, _mpiexec_of, run_job
from .training.record import DIR_ENV, FINAL_FILE, STEPS_ENV, STEPS_FILE

__all__ = ["Run", "compare"]

SAME, DIFFER, FAILED = 0, 1, 2


@dataclass
class Run:
    """One run's records: ``steps[s]`` maps each path to its digest at step s + 1, ``final``
    the tensors after the last step (``Run.read(label, world, folder)`` reads a run's folder).

    >>> Run("2 ranks", 2, steps=[{"model.weight": "5f0c"}]).steps[0]["model.weight"]
    '5f0c'
    """

    label: str
    world: int
    threads: int = 0
    steps: list[dict[str, str]] = field(default_factory=list)
    final: dict[str, torch.Tensor] = field(default_factory=dict)

    @classmethod
    def read(cls, label: str, world: int, folder: str) -> Run:
        run = cls(label, world)
        path = os.path.join(folder, STEPS_FILE)
        if os.path.exists(path):
            with open(path) as f:
                lines = [json.loads(line) for line in f if line.strip()]
            if lines:
                run.threads = int(lines[0].get("threads", 0))
                run.steps = [line["digests"] for line in lines[1:]]
        final = os.path.join(folder, FINAL_FILE)
        if os.path.exists(final):
            run.final = torch.load(final)
        return run


def _names(runs: list[Run]) -> str:
    return ", ".join(r.label for r in runs)


def _largest_difference(a: torch.Tensor, b: torch.Tensor) -> str:
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"shape {tuple(a.shape)} {a.dtype} against {tuple(b.shape)} {b.dtype}"
    if not a.is_floating_point():
        return f"{int((a != b).sum())} of {a.numel()} elements differ"
    diff = (a.double() - b.double()).abs().nan_to_num(nan=float("inf"))
    return f"largest difference {float(diff.max()):.3g}"


def compare(runs: list[Run], steps: int) -> tuple[int, list[str]]:
    """(status, report lines): the first step and tensor at which ``runs`` differ from the
    first run, then the final tensors under ``torch.equal``.

    >>> a, b = Run("1 rank", 1, steps=[{"w": "1"}, {"w": "2"}]), Run("2 ranks", 2)
    >>> b.steps = [{"w": "1"}, {"w": "3"}]
    >>> compare([a, b], 2)[1][0]
    "differ: first at step 2 of 2, 'w': at 2 ranks it differs from 1 rank (1 of 1 entries differ there)"
    """
    ref, others = runs[0], runs[1:]
    short = [r for r in runs if len(r.steps) < steps]
    if short:
        return FAILED, [
            f"failed: {r.label} recorded {len(r.steps)} of {steps} steps (does the script call "
            "fm.record_step after each step, and run that many?)"
            for r in short
        ]
    for s in range(steps):
        want = ref.steps[s]
        differ = [r for r in others if r.steps[s] != want]
        if not differ:
            continue
        # the first path, in the reference's order, that any run has otherwise
        paths = list(want) + [p for r in differ for p in r.steps[s] if p not in want]
        path = next(p for p in paths if any(r.steps[s].get(p) != want.get(p) for r in differ))
        who = [r for r in differ if r.steps[s].get(path) != want.get(path)]
        agree = [r for r in runs[1:] if r not in who]
        n = sum(any(r.steps[s].get(p) != want.get(p) for r in differ) for p in set(paths))
        line = f"differ: first at step {s + 1} of {steps}, {path!r}: at {_names(who)} it "
        line += f"differs from {ref.label} ({n} of {len(set(paths))} entries differ there)"
        if path not in want or any(path not in r.steps[s] for r in who):
            line += "; some runs lack it: different models or optimizers"
        if agree:
            line += f"; {_names(agree)}: the same as {ref.label}"
        lines = [line]
        threads = {r.threads for r in runs}
        if len(threads) > 1:
            lines.append(
                "note: the runs used different intra-op thread counts "
                f"({', '.join(f'{r.label}: {r.threads}' for r in runs)}); set OMP_NUM_THREADS"
            )
        return DIFFER, lines + _final_lines(runs)
    return SAME, [
        f"same bits: {len(ref.steps[0])} digests at each of {steps} steps are equal at "
        f"{_names(runs)}"
    ] + _final_lines(runs)


def _final_lines(runs: list[Run]) -> list[str]:
    ref = runs[0]
    if not ref.final:
        return []
    lines = []
    for r in runs[1:]:
        bad = [
            p for p, t in ref.final.items() if p not in r.final or not torch.equal(t, r.final[p])
        ]
        if not bad:
            lines.append(f"final: {r.label}: all {len(ref.final)} tensors torch.equal")
            continue
        first = bad[0]
        how = _largest_difference(r.final[first], ref.final[first]) if first in r.final else ""
        lines.append(
            f"final: {r.label}: {len(bad)} of {len(ref.final)} tensors differ from "
            f"{ref.label}'s; the first, {first!r}: {how or 'missing'}"
        )
    return lines


def _label(world: int, seen: int) -> str:
    name = f"{world} rank" + ("s" if world > 1 else "")
    return name if seen == 1 else f"{name} (run {seen})"


# Options whose value is words for another command line, and so often starts with "-"
# (--mpiexec-args "--oversubscribe"), which argparse would take for an option of its own.
_WORDS_OPTIONS = ("--mpiexec-args", "--python")


def _joined_values(argv: list[str]) -> list[str]:
    """``argv`` with each of _WORDS_OPTIONS joined to the value after it, as ``--opt=value``.

    >>> _joined_values(["s.py", "--mpiexec-args", "--oversubscribe", "--steps", "3"])
    ['s.py', '--mpiexec-args=--oversubscribe', '--steps', '3']
    """
    out, i = [], 0
    while i < len(argv):
        if argv[i] in _WORDS_OPTIONS and i + 1 < len(argv):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def _parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m fluxmpi_py.reproduce",
        description="Run a script at several world sizes and compare its per-step digests.",
    )
    ap.add_argument("script")
    ap.add_argument("--ranks", required=True, help="world sizes, e.g. 1,2,4 (may repeat)")
    ap.add_argument("--steps", required=True, type=int)
    ap.add_argument("--timeout", type=float, default=0.0)
    ap.add_argument("--mpiexec", default="mpiexec")
    ap.add_argument("--mpiexec-args", default="")
    ap.add_argument("--python", default="")
    ap.add_argument("--out", default="")
    # the script's own arguments come after "--"
    cut = argv.index("--") if "--" in argv else len(argv)
    args = ap.parse_args(_joined_values(argv[:cut]))
    args.args = argv[cut + 1 :]
    try:
        args.worlds = [int(w) for w in args.ranks.split(",")]
    except ValueError:
        args.worlds = []
    if not args.worlds or min(args.worlds) < 1:
        ap.error(f"--ranks takes world sizes >= 1 separated by commas, got {args.ranks!r}")
    if len(args.worlds) < 2:
        ap.error(f"--ranks needs two runs or more to compare, got {args.ranks!r}")
    if args.steps < 1:
        ap.error(f"--steps must be >= 1, got {args.steps}")
    return args


_timed_out: list[bool] = []


def _alarm(signum, frame) -> None:
    _timed_out.append(True)
    raise KeyboardInterrupt  # run_job ends mpiexec as on Ctrl-C


def _launch(args: argparse.Namespace, world: int, folder: str) -> tuple[int, str]:
    """One run at `world` ranks: (status, how it ended)."""
    os.makedirs(folder, exist_ok=True)
    os.environ[DIR_ENV], os.environ[STEPS_ENV] = folder, str(args.steps)
    words = ["-n", str(world), *shlex.split(args.mpiexec_args)]
    if _is_open_mpi(_mpiexec_of(RunOptions(mpiexec=args.mpiexec))):
        words = ["-x", DIR_ENV, "-x", STEPS_ENV, *words]  # for ranks on other hosts
    words += [*(shlex.split(args.python) or [sys.executable]), args.script, *args.args]
    _timed_out.clear()
    previous = signal.signal(signal.SIGALRM, _alarm)
    if args.timeout:
        signal.setitimer(signal.ITIMER_REAL, args.timeout)
    try:
        status = run_job(RunOptions(mpiexec_args=words, mpiexec=args.mpiexec))
    except KeyboardInterrupt:
        if not _timed_out:
            raise
        status = 124
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        del os.environ[DIR_ENV], os.environ[STEPS_ENV]
    if _timed_out:
        return 124, f"still running after --timeout {args.timeout:g} s: ended"
    return status, f"exit status {status}"


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory(prefix="fluxmpi-reproduce-") as tmp:
        out = args.out or tmp
        runs = []
        for i, world in enumerate(args.worlds):
            label = _label(world, args.worlds[: i + 1].count(world))
            folder = os.path.join(out, f"run{i}-np{world}")
            print(f"reproduce: {label}: {args.script}", flush=True)
            status, how = _launch(args, world, folder)
            if status != 0:
                print(f"failed: {label}: {how}", flush=True)
                return FAILED
            runs.append(Run.read(label, world, folder))
        status, lines = compare(runs, args.steps)
    for line in lines:
        print(line, flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
