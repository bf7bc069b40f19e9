"""allreduce_, bcast_, reduce_, Iallreduce, Ibcast at world sizes 1, 2, 3 and 4 (and a world of
one started without mpiexec). The cases live in tests/workers/collectives_worker.py,
collectives_layouts_worker.py, collectives_bad_input_worker.py and
collectives_carried_worker.py."""

import os
import re
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import worker_params  # noqa: E402

# closed forms, async and the runtime; layouts and 16-bit accumulation; bad input; carried
WORKER = [
    "collectives_worker.py",
    "collectives_layouts_worker.py",
    "collectives_bad_input_worker.py",
    "collectives_carried_worker.py",
]


def check_ordered_stdout(out, np):
    # fluxmpi_println(..., ordered=True) on stdout: every rank's line, in rank order
    lines = re.findall(rf"^\[(\d+) / {np}\] ordered-stdout (\d+)$", out, re.M)
    assert [int(a) for a, _ in lines] == list(range(np)), out[-2000:]
    assert f"[{np - 1} / {np}] only-rank-{np - 1}-prints" in out


@pytest.mark.parametrize("case", worker_params(WORKER, [1, 2, 3, 4], timeout=300))
def test_collectives_under_mpiexec(case):
    out = case.check_passed()
    if case.name == "case_print_prefix_and_order":  # what that case printed to the job's stdout
        check_ordered_stdout(out, case.np)


@pytest.mark.parametrize("case", worker_params(WORKER, [None], timeout=300))
def test_collectives_without_mpiexec(case):
    # A plain `python script.py` is a world of one (MPI singleton), as in Jupyter.
    case.check_passed()


def test_ring_options_round_trip_and_checks():
    from fluxmpi_py._core import C

    saved = C.ring_options()
    try:
        o = C.RingOptions(sum_min_bytes=100, min_segment_bytes=8, max_segment_bytes=8)
        assert (o.enabled, o.average_min_bytes) == (True, 1 << 20)  # the other defaults
        C.set_ring_options(o)
        assert C.ring_options() == o
        assert "sum_min_bytes=100" in repr(C.ring_options())
        with pytest.raises(ValueError, match="min_segment_bytes <= max_segment_bytes"):
            C.set_ring_options(C.RingOptions(min_segment_bytes=9, max_segment_bytes=8))
        with pytest.raises(ValueError, match="min_segment_bytes <= max_segment_bytes"):
            C.set_ring_options(C.RingOptions(min_segment_bytes=0, max_segment_bytes=8))
        with pytest.raises(ValueError, match="ring thresholds must be >= 0"):
            C.set_ring_options(C.RingOptions(sum_min_bytes=-1))
        assert C.ring_options() == o  # a rejected set changes nothing
    finally:
        C.set_ring_options(saved)


@pytest.mark.parametrize(
    "value, expect",
    [
        ("", "RingOptions(enabled=True, sum_min_bytes=16777216"),
        ("12345", "RingOptions(enabled=True, sum_min_bytes=12345"),
        ("0", "RingOptions(enabled=False, sum_min_bytes=16777216"),
        (
            "lots",
            "ValueError: fluxmpi_py: FLUXMPI_RING_MIN_BYTES must be a byte count >= 0, got 'lots'",
        ),
    ],
)
def test_ring_min_bytes_environment_variable(value, expect, forked):
    # FLUXMPI_RING_MIN_BYTES sets the plain-sum threshold on first use; 0 turns the ring off.
    code = (
        "from fluxmpi_py._core import C\n"
        "try:\n    print(repr(C.ring_options()))\n"
        "except ValueError as e:\n    print('ValueError:', e)\n"
    )
    proc = forked.run(code, env_extra={"FLUXMPI_RING_MIN_BYTES": value}, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith(expect), proc.stdout + proc.stderr
