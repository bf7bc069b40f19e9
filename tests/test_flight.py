"""The flight recorder's reader (python -m fluxmpi_py.flight) on dumps made here: where ranks
in calls of different names parted, which rank arrived last, a directory without dumps; its
settings. The dumps of a real stalled job are read in tests/test_stalls.py, whose launches
write them (the timeout, SIGTERM) and a timeline (the sleep)."""

import json

import pytest

from fluxmpi_py import flight
from fluxmpi_py.runtime import recorder


def rec(number, kind, call, start, end, group=0):
    return {
        "seq": number,
        "group": group,
        "number": number,
        "kind": kind,
        "call": call,
        "bytes": 4,
        "enter_us": start,
        "start_us": start,
        "end_us": end,
    }


def write_dumps(tmp_path, per_rank, time_us=10_000_000):
    for rank, records in per_rank.items():
        doc = {
            "fluxmpi_flight": 1,
            "rank": rank,
            "size": len(per_rank),
            "reason": "timeout",
            "why": "",
            "time_us": time_us,
            "capacity": 256,
            "recorded": len(records),
            "records": records,
        }
        (tmp_path / f"fluxmpi_flight.{rank}.json").write_text(json.dumps(doc))


def test_swapped_calls_part_at_the_first_call_of_another_name(tmp_path, capsys):
    # Three calls in step, then rank 1 entered a broadcast where rank 0 entered an allreduce.
    same = [rec(n, "allreduce", "allreduce_() at t.py:5", n * 100, n * 100 + 50) for n in (1, 2, 3)]
    write_dumps(
        tmp_path,
        {
            0: same + [rec(4, "allreduce", "allreduce_() at t.py:9", 1000, None)],
            1: same + [rec(4, "broadcast", "bcast_() at t.py:11", 1000, None)],
        },
    )
    assert flight.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert (
        "world: the last call every rank completed: #3 allreduce (of allreduce_() at t.py:5)" in out
    )
    assert "world: the ranks parted at call #4:" in out, out
    assert "rank 0: inside #4 allreduce (of allreduce_() at t.py:9) for 10.0 s" in out, out
    assert "rank 1: inside #4 broadcast (of bcast_() at t.py:11)" in out, out


def test_arrival_lags_name_the_rank_that_waited_least(tmp_path):
    # Every call ends at the same time on every rank; rank 2 reached each 30-70 us after the
    # first rank, rank 1 10 us after it once.
    per_rank = {r: [] for r in range(3)}
    for n in range(1, 11):
        end = n * 1000
        late = 30 + 4 * n  # rank 2's lag at call n
        starts = {0: end - 500, 1: end - 500 + (10 if n == 5 else 0), 2: end - 500 + late}
        for r in per_rank:
            per_rank[r].append(rec(n, "allreduce", "step()", starts[r], end))
    write_dumps(tmp_path, per_rank)
    dumps = flight.load(str(tmp_path))
    lags = flight.arrival_lags(dumps, 0)
    assert lags["calls"] == 10
    assert lags["ranks"][2]["last"] == 10 and lags["ranks"][2]["max_us"] == 70
    assert lags["ranks"][2]["mean_us"] == pytest.approx(sum(30 + 4 * n for n in range(1, 11)) / 10)
    assert lags["ranks"][0]["max_us"] == 0 and lags["ranks"][1]["max_us"] == 10
    assert flight.arrival_lags(dumps, 0, last=3)["ranks"][2]["max_us"] == 70
    assert flight.arrival_lags(dumps, 0, last=3)["calls"] == 3
    text = flight.report(dumps)
    assert "the ranks did not part" in text and "slowest to arrive: rank 2" in text, text
    assert "arrived last in 10 of 10" in text, text


def test_a_directory_without_dumps(tmp_path, capsys):
    assert flight.main([str(tmp_path)]) == 1
    assert "no fluxmpi_flight.<rank>.json in" in capsys.readouterr().err
    assert flight.main([str(tmp_path / "absent")]) == 2


def test_settings_from_init_then_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("FLUXMPI_FLIGHT_DIR", str(tmp_path))
    monkeypatch.setenv("FLUXMPI_FLIGHT_SIZE", "16")
    monkeypatch.setenv("FLUXMPI_TIMELINE", "t.json")
    assert recorder.settings() == (str(tmp_path), 16, "t.json")
    assert recorder.settings(flight_dir=None)[0] == ""
    monkeypatch.setenv("FLUXMPI_FLIGHT_SIZE", "many")
    with pytest.raises(ValueError, match=r"FLUXMPI_FLIGHT_SIZE: expected a number of calls"):
        recorder.settings()
    monkeypatch.delenv("FLUXMPI_FLIGHT_SIZE")
    with pytest.raises(TypeError, match=r"Init\(flight_dir=...\) takes a directory path or None"):
        recorder.settings(flight_dir=3)
