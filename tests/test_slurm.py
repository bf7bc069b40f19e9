"""Under a real Slurm (tests/slurm_cluster.py: munged, slurmctld and slurmd of this machine,
in a temporary directory, started once for this file): ``srun --mpi=pmix`` trains as mpiexec
does, bit for bit; ``srun`` without PMIx raises on every task, naming the fix; a batch job
that ``scancel --signal=USR1`` stops mid-training checkpoints, is requeued, resumes and ends
bit-identical to an uninterrupted run; a killed rank leaves the job failed in ``sacct``.
Skipped, saying why, where the cluster cannot be made (not root, Slurm not installed)."""

import os
import re
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import slurm_cluster  # noqa: E402
import stop_runs  # noqa: E402
import virtual_hosts  # noqa: E402
from mpi_util import ROOT  # noqa: E402
from stop_runs import STEPS, TIMEOUT, TRAIN, digests, progress  # noqa: E402

WHY_NOT = slurm_cluster.unavailable_reason()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"no Slurm cluster: {WHY_NOT}")


@pytest.fixture(scope="module")
def cluster():
    with slurm_cluster.SlurmCluster(cpus=2) as c:
        yield c


def task_env(cluster, **extra):
    return cluster.env(
        PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
        PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
        OMP_NUM_THREADS="1",
        OMPI_MCA_psec="^munge",
        **extra,
    )


def srun(cluster, args, timeout=TIMEOUT, mpi="pmix", check=True):
    argv = ["srun", f"--mpi={mpi}", "-n", "2", "--overcommit", *args]
    return cluster.run(argv, timeout=timeout, check=check, env=task_env(cluster))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """stop_train.py's digests after STEPS uninterrupted steps under mpiexec."""
    return stop_runs.uninterrupted(tmp_path_factory.mktemp("mpiexec"))


def test_srun_pmix_trains_as_mpiexec_does(cluster, tmp_path, uninterrupted):
    out = srun(cluster, [sys.executable, TRAIN, str(tmp_path), str(STEPS)])
    text = out.stdout + out.stderr
    tasks = re.findall(r"task rank=(\d) size=(\d) node_rank=(\d) node_size=(\d) job=(\d+)", text)
    assert sorted(t[:4] for t in tasks) == [("0", "2", "0", "2"), ("1", "2", "1", "2")], text
    job = tasks[0][4]
    # Init's verbose line names the Slurm job and step
    assert re.search(rf"using cpu \(node-local rank \d of 2, Slurm job {job}, step 0\)", text), text
    assert digests(text) == uninterrupted, text[-3000:]  # bit for bit what mpiexec trained


def test_srun_without_pmix_raises_on_every_task(cluster):
    code = "import fluxmpi_py as fm; fm.Init(); print('initialized', fm.total_workers())"
    out = srun(cluster, [sys.executable, "-c", code], mpi="none", check=False, timeout=120)
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "initialized" not in text, text
    for task in (0, 1):  # each task raised before MPI_Init, naming the fix
        assert re.search(rf"RuntimeError: fluxmpi_py.Init\(\): task {task} of the 2 tasks", text)
    assert text.count("Launch with `srun --mpi=pmix -n 2 ...`") == 2, text
    assert "rebuild" not in text.lower(), text  # not Open MPI's advice to rebuild Slurm


def test_stall_report_names_the_slurm_job(cluster):
    code = (
        "import time, fluxmpi_py as fm\n"
        "fm.Init(stall_warning=1, timeout=30)\n"
        "if fm.local_rank() == 1: time.sleep(4)\n"
        "fm.barrier(); print('passed', fm.local_rank())\n"
    )
    out = srun(cluster, [sys.executable, "-c", code], timeout=120)
    text = out.stdout + out.stderr
    assert "fluxmpi_py: stall" in text and text.count("passed") == 2, text
    assert re.search(r"  in Slurm job \d+, step 0\n", text), text


def test_timeout_ends_the_step(cluster):
    code = (
        "import time, fluxmpi_py as fm\n"
        "fm.Init(stall_warning=1, timeout=3)\n"
        "if fm.local_rank() == 1: time.sleep(600)\n"
        "fm.barrier(); print('passed', fm.local_rank())\n"
    )
    # rank 1 would sleep past srun's own limit here: only the timeout's abort ends it in time
    out = srun(cluster, [sys.executable, "-c", code], timeout=120, check=False)
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "passed" not in text, text
    assert "fluxmpi_py: timeout" in text and re.search(r"in Slurm job \d+, step 0", text), text


EXAMPLES = os.path.join(ROOT, "examples", "slurm")


def sbatch(cluster, args):
    """Submit a batch job from the clone's root; its id."""
    out = cluster.run(["sbatch", "--parsable", *args], timeout=60, env=task_env(cluster), cwd=ROOT)
    return out.stdout.strip().split(";")[0]


def test_sbatch_trains_the_digits_demo(cluster, tmp_path):
    log = tmp_path / "digits.out"
    job = sbatch(
        cluster,
        [f"--output={log}", "--overcommit", os.path.join(EXAMPLES, "digits.sbatch")]
        + ["--epochs", "1", "--min-accuracy", "0.3"],
    )
    state = cluster.wait_job(job, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), timeout=TIMEOUT)
    text = log.read_text()
    assert state == "COMPLETED", text + cluster.logs()
    assert "weights identical on all 2 ranks: yes" in text and "OK" in text, text


def test_sbatch_usr1_stops_requeues_and_resumes_bit_identical(cluster, tmp_path, uninterrupted):
    job = sbatch(
        cluster,
        [
            f"--output={tmp_path}/job.out",
            "--overcommit",
            os.path.join(EXAMPLES, "preemptible.sbatch"),
        ]
        + [sys.executable, TRAIN, str(tmp_path), str(STEPS), "--delay", "0.15", "--hold"],
    )
    deadline = time.monotonic() + 150
    while progress(tmp_path) < 8:
        assert time.monotonic() < deadline, cluster.logs()
        # None: slurmctld did not answer this poll (a loaded machine), which says nothing
        assert cluster.job_state(job) in (None, "PENDING", "RUNNING", "CONFIGURING"), cluster.logs()
        time.sleep(0.3)
    # The time limit's warning, as #SBATCH --signal=USR1@60 sends it: to the job's steps
    cluster.run(["scancel", "--signal=USR1", job], timeout=30)
    state = cluster.wait_job(job, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), timeout=240)
    log = (tmp_path / "job.out").read_text()
    assert state == "COMPLETED", log + cluster.logs()
    stopped = re.findall(r"rank (\d): stopped after step (\d+)", log)
    assert len(stopped) == 2 and stopped[0][1] == stopped[1][1], log  # both, at the same step
    assert "srun exited 75 (restart 0)" in log and "srun exited 0 (restart 1)" in log, log
    assert len(re.findall(rf"resumed from ckpt-0*{stopped[0][1]}\.pt", log)) == 2, log
    assert 8 <= int(stopped[0][1]) < STEPS, log
    assert digests(log) == uninterrupted, log[-3000:]  # bit for bit, the generators too


def test_killed_rank_fails_the_job_in_sacct(cluster, tmp_path):
    out = srun(cluster, [sys.executable, TRAIN, str(tmp_path), "20", "--kill-at", "3"], check=False)
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "killing myself after step 3" in text, text
    assert "task 0: Killed" in text, text  # srun ended the step: rank 0 waits no more
    job = re.search(r"job=(\d+)", text).group(1)
    deadline = time.monotonic() + 60
    while True:
        rows = {r[0]: r for r in cluster.completed()}
        if job in rows or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert job in rows, (rows, cluster.logs())
    assert rows[job][2] == "FAILED", rows[job]


ACROSS = """
import socket, torch, fluxmpi_py as fm
fm.Init(verbose=True)
torch.manual_seed(0)
model = fm.synchronize_(torch.nn.Linear(4, 2))
opt = fm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
for _ in range(3):
    opt.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step()
fm.check_consistency((model, opt))
total = fm.allreduce_(torch.tensor([fm.local_rank() + 1.0]), op="sum").item()
print(f"rank={fm.local_rank()} size={fm.total_workers()} node_rank={fm.node_local_rank()} "
      f"node_size={fm.node_size()} host={socket.gethostname()} sum={total}", flush=True)
"""


def test_srun_across_two_nodes(tmp_path):
    """Two slurmd, each in a virtual host of its own (tests/virtual_hosts.py), and
    `srun -N 2` from the head namespace: one rank per node, joined over TCP."""
    why = virtual_hosts.unavailable_reason()
    if why is not None:
        pytest.skip(f"no virtual hosts: {why}")
    script = tmp_path / "across.py"
    script.write_text(ACROSS)
    with virtual_hosts.VirtualCluster(hosts=2) as vc:
        with slurm_cluster.SlurmCluster(cpus=2, hosts=vc) as cluster:
            argv = ["srun", "--mpi=pmix", "-N", "2", "-n", "2", sys.executable, str(script)]
            out = cluster.run(argv, timeout=TIMEOUT, env=task_env(cluster))
    text = out.stdout + out.stderr
    found = sorted(re.findall(r"rank=(\d) size=2 node_rank=0 node_size=1 host=(\w+) sum=3.0", text))
    assert found == [("0", "node0"), ("1", "node1")], text


INSIDE = """#!/bin/bash
#SBATCH --ntasks=2
#SBATCH --overcommit
#SBATCH --output={log}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
timeout 120 mpiexec -n 2 {python} -c "{code}"; echo "mpiexec exited $?"
timeout 120 {python} -m fluxmpi_py.run -n 2 --max-restarts 1 {python} -c "{code}"
echo "the launcher exited $?"
"""


def test_mpiexec_and_the_launcher_inside_an_allocation(cluster, tmp_path):
    code = "import fluxmpi_py as fm; fm.Init(verbose=True); print('world', fm.total_workers())"
    log = tmp_path / "inside.out"
    script = tmp_path / "inside.sh"
    script.write_text(INSIDE.format(log=log, python=sys.executable, code=code))
    job = sbatch(cluster, [str(script)])
    state = cluster.wait_job(job, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), timeout=TIMEOUT)
    text = log.read_text()
    assert state == "COMPLETED", text + cluster.logs()
    assert "mpiexec exited 0" in text and "the launcher exited 0" in text, text
    assert text.count("world 2") == 4, text  # 2 ranks each time, Open MPI read the allocation
    assert text.count(f"Slurm job {job})") == 4, text
