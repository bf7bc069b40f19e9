"""fluxmpi_py across hosts: virtual hosts on this machine (tests/virtual_hosts.py), each a
network namespace with its own hostname, joined by TCP only; Open MPI starts the ranks on them
through a launch agent, as it would over ssh. Worker: tests/workers/multihost_worker.py.

Skipped, with the reason, where the machine does not permit network namespaces."""

import os
import sys
import tempfile
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import virtual_hosts  # noqa: E402
from mpi_util import RESULTS_ENV, Launch, _read_records, mpi_env, worker_cases  # noqa: E402

WORKER = os.path.join(os.path.dirname(__file__), "workers", "multihost_worker.py")
HOSTS, PER_HOST = 2, 2
TIMEOUT = 240  # the whole harness run; a failure run ends in seconds
FAIL_TIMEOUT = 90

REASON = virtual_hosts.unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"no virtual hosts: {REASON}")


@pytest.fixture(scope="module")
def cluster():
    with virtual_hosts.VirtualCluster(hosts=HOSTS) as c:
        yield c


def worker_env(extra=None):
    env = mpi_env(extra)
    env.update(FLUXMPI_TEST_HOSTS=str(HOSTS), FLUXMPI_TEST_RANKS_PER_HOST=str(PER_HOST))
    return env


_LAUNCH = {}


def harness_launch(cluster):
    """The worker's cases across the hosts, run once for the module; its Launch."""
    if "cases" not in _LAUNCH:
        with tempfile.TemporaryDirectory(prefix="harness-results-") as results:
            t0 = time.monotonic()
            rc, out, timed_out = cluster.mpiexec(
                [sys.executable, WORKER],
                PER_HOST,
                TIMEOUT,
                env=worker_env({RESULTS_ENV: results}),
            )
            seconds = time.monotonic() - t0
            records = _read_records(results)
        print(f"{HOSTS} hosts x {PER_HOST} ranks: exit {rc} after {seconds:.1f}s")
        _LAUNCH["cases"] = Launch(
            "multihost_worker.py", HOSTS * PER_HOST, TIMEOUT, rc, out, timed_out, seconds, records
        )
    return _LAUNCH["cases"]


@pytest.mark.parametrize("case", worker_cases(WORKER) + ["clean_exit"])
def test_across_hosts(cluster, case):
    launch = harness_launch(cluster)
    if case == "clean_exit":
        launch.check_exit()
    else:
        launch.check_case(case)


@pytest.mark.parametrize("mode", ["raise", "killed"])
def test_failing_rank_ends_the_job_on_every_host(cluster, mode):
    t0 = time.monotonic()
    rc, out, timed_out = cluster.mpiexec(
        [sys.executable, WORKER, mode], PER_HOST, FAIL_TIMEOUT, env=worker_env()
    )
    print(f"{mode}: exit {rc} after {time.monotonic() - t0:.1f}s")
    last = HOSTS * PER_HOST - 1
    assert not timed_out, f"the job hung for {FAIL_TIMEOUT}s after rank {last} failed:\n{out}"
    assert rc != 0, out[-3000:]
    assert f"rank {last} on node{HOSTS - 1} fails ({mode})" in out, out[-3000:]
    assert "the collective returned" not in out, out[-3000:]
    if mode == "raise":
        assert f"RuntimeError: deliberate failure on rank {last}" in out, out[-3000:]
    # nothing of the job is left on any host
    time.sleep(0.5)
    for ns in cluster.namespaces.values():
        left = virtual_hosts._sh(["ip", "netns", "pids", ns], check=False).stdout.split()
        assert not left, f"processes left in {ns} after the job ended: {left}"
