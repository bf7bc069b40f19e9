"""synchronize_: the broadcast plan (pure, no MPI) and the worker at 1, 2 and 3 ranks."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import worker_params  # noqa: E402

from fluxmpi_py._core import C  # noqa: E402


def options(bucket, direct, pack_cpu=False):
    return C.BroadcastPlanOptions(bucket_bytes=bucket, direct_bytes=direct, pack_cpu=pack_cpu)


def plan(sizes, bucket, direct, dtype=torch.float32, pack_cpu=False):
    return [
        (d, list(m), b)
        for d, m, b in C.plan_broadcast(
            [torch.empty(n, dtype=dtype) for n in sizes], options(bucket, direct, pack_cpu)
        )
    ]


def test_plan_packs_small_tensors_in_order_at_aligned_offsets():
    # 4-byte floats; offsets are aligned to 64 bytes, so each small tensor takes 64 bytes
    assert plan([1, 3, 16], bucket=1024, direct=1024) == [(False, [0, 1, 2], 192)]
    assert plan([17], bucket=1024, direct=1024) == [(False, [0], 128)]


def test_plan_skips_empty_tensors_and_handles_no_tensors():
    assert plan([], 1024, 1024) == []
    assert plan([0, 0], 1024, 1024) == []
    assert plan([0, 1, 0], 1024, 1024) == [(False, [1], 64)]


def test_plan_closes_a_bucket_at_the_cap():
    # three tensors of 64 aligned bytes with a 128-byte cap: two buckets
    assert plan([16, 16, 16], bucket=128, direct=1 << 20) == [
        (False, [0, 1], 128),
        (False, [2], 64),
    ]


def test_plan_packs_large_cpu_tensors_when_asked_up_to_the_cap():
    # the plan for relocated parameters: over direct_bytes but within the cap -> packed
    # (bytes 60, 64, 4, 160 take 64, 64, 64 and 192 aligned bytes)
    assert plan([15, 16, 1, 40], bucket=256, direct=64, pack_cpu=True) == [
        (False, [0, 1, 2], 192),
        (False, [3], 192),
    ]
    assert plan([15, 16, 1, 40], bucket=512, direct=64, pack_cpu=True) == [
        (False, [0, 1, 2, 3], 384)
    ]
    assert plan([200], bucket=512, direct=64, pack_cpu=True) == [(True, [0], 800)]  # over the cap


def test_dict_version_changes_with_every_modification():
    # synchronize_'s cached walk trusts an unchanged version tag (CPython < 3.12); -1 = none
    d = {"a": 1}
    v = C.dict_version(d)
    if v == -1:
        assert sys.version_info >= (3, 12)
        return
    d["b"] = 2
    v2 = C.dict_version(d)
    del d["b"]
    v3 = C.dict_version(d)
    assert len({v, v2, v3}) == 3
    assert C.dict_version(d) == v3  # reading does not change it
    import collections

    assert C.dict_version(collections.OrderedDict(a=1)) == -1  # subclasses: entries compared


def test_plan_sends_large_tensors_alone():
    # at the direct threshold (64 bytes) or beyond the cap a tensor goes alone, in place
    assert plan([15, 16, 1, 40], bucket=128, direct=64) == [
        (False, [0, 2], 128),
        (True, [1], 64),
        (True, [3], 160),
    ]
    assert plan([40], bucket=128, direct=1 << 20) == [(True, [0], 160)]


def test_plan_mixes_dtypes_in_one_byte_buffer():
    ts = [
        torch.empty(3, dtype=torch.float64),
        torch.empty(5, dtype=torch.int8),
        torch.empty(2, dtype=torch.bool),
    ]
    assert [(d, list(m), b) for d, m, b in C.plan_broadcast(ts, options(1024, 1024))] == [
        (False, [0, 1, 2], 192)
    ]


# synchronize_'s cases, by feature: tensors, modules and optimizers; relocation into flat
# storages; containers, values and what it refuses
SYNC_WORKERS = ["sync_worker.py", "sync_relocation_worker.py", "sync_values_worker.py"]


@pytest.mark.parametrize("case", worker_params(SYNC_WORKERS, [1, 2, 3], timeout=240))
def test_sync_worker(case):
    case.check_passed()
