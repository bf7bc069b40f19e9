"""A one-node Slurm cluster in a temporary directory, for running jobs under srun and sbatch
in tests.

PID 1 here is not systemd, so the cluster starts its own daemons, each in the foreground as a
child of this process: ``munged`` (on a socket of its own, with a fresh key), ``slurmctld`` and
``slurmd``. Everything they write (the configuration, the state, the spool, the pid and log
files, the job completion log that ``sacct -c`` reads) lies in the directory; the ports are
free ones, and every name carries this process's id, so that two test sessions on one machine
do not meet. ``SLURM_CONF`` in :meth:`SlurmCluster.env` points the clients (``srun``,
``sbatch``, ``scancel``, ``sacct``) at it.

    with SlurmCluster() as cluster:
        out = cluster.run(["srun", "--mpi=pmix", "-n", "2", "python", "train.py"], timeout=120)

``close()`` cancels the jobs, ends the daemons (SIGTERM, then SIGKILL) and then kills every
process whose environment names the directory (job steps, ``slurmstepd``), so that nothing is
left behind even when a test fails. Needs root (``SlurmUser=root``) and the Debian packages
``slurmctld slurmd slurm-client munge`` (``make test`` installs them where apt runs as root);
``unavailable_reason()`` says why a cluster cannot be made.
"""

import os
import random
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time

from virtual_hosts import SUBNET

STEP_TIMEOUT = 30  # seconds for a client command (sinfo, scancel, sacct)
START_TIMEOUT = 60  # seconds until the node is idle
MARK = "FLUXMPI_SLURM_CLUSTER"  # in every daemon's and job's environment: the directory
PLUGIN_DIRS = ("/usr/lib/x86_64-linux-gnu/slurm-wlm", "/usr/lib/aarch64-linux-gnu/slurm-wlm")

CONF = """\
ClusterName={name}
FirstJobId={first_job_id}
SlurmctldHost={controller}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={dir}/munge/socket,cred_expire=10
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool/%n
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd-%n.pid
SlurmctldLogFile={dir}/log/slurmctld.log
SlurmdLogFile={dir}/log/slurmd-%n.log
TmpFS={dir}/nodetmp
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault={mpi_default}
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobCompType=jobcomp/filetxt
JobCompLoc={dir}/log/jobcomp.txt
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
KillWait=10
MinJobAge=600
SchedulerParameters=sched_interval=1
{nodes}PartitionName=debug Nodes={node_list} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
"""


def _first_job_id():
    """A first job id of this cluster's own. Open MPI names a job's shared-memory segments
    (/dev/shm/sm_segment.HOST.UID.JOBID.RANK) after its PMIx namespace, which under srun is
    slurm.pmix.JOB.STEP; a rank killed by a test leaves its segment behind, and a cluster that
    numbered its jobs from 1 again, as every test session's did, opened a killed job's segment
    as its own: ranks then crashed in Open MPI's shared-memory progress (seen 2026-11-29)."""
    return 1000 + random.SystemRandom().randrange(60_000_000)


def _cgroup_mounts():
    """Shell commands that mount this machine's cgroup hierarchies again under /sys/fs/cgroup
    (``ip netns exec`` mounts a fresh /sys, without them, and slurmd will not start without
    its cgroup plugin)."""
    with open("/proc/self/mounts") as f:
        mounts = [line.split() for line in f]
    root = [m for m in mounts if m[1] == "/sys/fs/cgroup"]
    if root and root[-1][2] == "cgroup2":
        return "mount -t cgroup2 none /sys/fs/cgroup && "
    out = "mount -t tmpfs cgroup_root /sys/fs/cgroup && "
    for _, where, kind, options, *_ in mounts:
        if kind != "cgroup" or not where.startswith("/sys/fs/cgroup/"):
            continue
        opts = [o for o in options.split(",") if o not in ("rw", "ro", "relatime", "nosuid",
                                                            "nodev", "noexec")]  # fmt: skip
        if all(o.startswith("name=") for o in opts):
            opts.insert(0, "none")
        out += f"mkdir -p {where} && mount -t cgroup -o {','.join(opts)} cgroup {where} && "
    return out


def unavailable_reason():
    """None when a cluster can be made here; else why not (a test skips with it)."""
    if os.geteuid() != 0:
        return "the Slurm tests run the daemons as root (SlurmUser=root); not root here"
    for tool in ("munged", "mungekey", "slurmctld", "slurmd", "srun", "sbatch", "sacct"):
        if shutil.which(tool) is None:
            return (
                f"`{tool}` is not installed (make test installs slurmctld slurmd slurm-client "
                "munge where apt-get runs as root)"
            )
    if not any(os.path.exists(os.path.join(d, "mpi_pmix.so")) for d in PLUGIN_DIRS):
        return "Slurm's PMIx plugin (mpi_pmix.so, slurm-wlm-basic-plugins) is not installed"
    return None


def _free_ports(n):
    """n distinct TCP ports that are free now, below the kernel's ephemeral range: the daemons
    bind them only later, and a port the kernel hands out (bind to 0, or any process's
    outgoing connection, MPI's own among them) could be taken again in between."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral = int(f.read().split()[0])
    low = max(1024, min(20000, ephemeral - 4096))
    socks, ports = [], []
    try:
        while len(ports) < n:
            s = socket.socket()
            try:
                s.bind(("", random.randrange(low, ephemeral)))
            except OSError:  # in use: another
                s.close()
                continue
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def _pids_marked(directory):
    """The processes whose environment carries MARK=directory (daemons, steps, tasks)."""
    needle = f"{MARK}={directory}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


class SlurmCluster:
    """One node (this host, ``cpus`` CPUs, oversubscribed) in partition ``debug``. A context
    manager: leaving it ends every process it started.

    ``hosts``: an entered VirtualCluster (tests/virtual_hosts.py): then each of its hosts is a
    node, its slurmd in the host's namespaces (its hostname, its address on the bridge, its own
    spool and TmpFS, where the PMIx plugin keeps its files), and slurmctld and every client
    command run in its head namespace, as on a login node."""

    def __init__(self, cpus=2, mpi_default="none", hosts=None):
        self.cpus = cpus
        self.mpi_default = mpi_default
        self.vc = hosts
        self.nodes = list(hosts.hosts) if hosts is not None else [socket.gethostname()]
        self.name = f"fm{os.getpid()}"
        self.dir = None
        self.procs = {}

    # -- making and removing
    def __enter__(self):
        self.dir = tempfile.mkdtemp(prefix="fluxmpi-slurm-")
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def env(self, **extra):
        """The environment for a client command (srun, sbatch ...) against this cluster."""
        env = dict(os.environ, SLURM_CONF=self.conf, **{MARK: self.dir})
        for k in [k for k in env if k.startswith(("SLURM_", "SBATCH_", "SRUN_", "PMIX_"))]:
            if k != "SLURM_CONF":
                del env[k]  # a suite run inside a Slurm job must not leak that job's settings
        env.update(extra)
        return env

    def _on(self, host, argv, setup=""):
        """``argv`` as run on virtual host ``host`` ("head": the login node), or as it is on a
        cluster of this host alone."""
        if self.vc is None:
            return argv
        ns = self.vc.head if host == "head" else self.vc.namespaces[host]
        inner = f"hostname {host} && {setup}exec {shlex.join(argv)}"
        return ["ip", "netns", "exec", ns, "unshare", "--uts", "--", "sh", "-c", inner]

    def _daemon(self, name, argv):
        log = open(os.path.join(self.dir, "log", f"{name}.out"), "wb")
        self.procs[name] = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=self.env(), start_new_session=True
        )
        log.close()

    def _start(self):
        d = self.dir
        os.chmod(d, 0o755)  # munged wants the socket's directory reachable by all
        for sub in ("munge", "state", "spool", "log", "nodetmp"):
            os.makedirs(os.path.join(d, sub))
        for node in self.nodes:
            os.makedirs(os.path.join(d, "spool", node))
            os.makedirs(os.path.join(d, "tmp", node))
        os.chmod(os.path.join(d, "munge"), 0o755)
        key = os.path.join(d, "munge", "munge.key")
        subprocess.run(
            ["mungekey", "--create", f"--keyfile={key}", "--force"],
            check=True,
            capture_output=True,
            timeout=STEP_TIMEOUT,
        )
        ctld_port, d_port = _free_ports(2)
        self.conf = os.path.join(d, "slurm.conf")
        with open(self.conf, "w") as f:
            f.write(
                CONF.format(
                    name=self.name,
                    controller=self.nodes[0] if self.vc is None else f"head({SUBNET}.1)",
                    nodes="".join(
                        f"NodeName={n} CPUs={self.cpus} State=UNKNOWN"
                        + ("" if self.vc is None else f" NodeAddr={self.vc.address[n]}")
                        + "\n"
                        for n in self.nodes
                    ),
                    node_list=",".join(self.nodes),
                    dir=d,
                    ctld_port=ctld_port,
                    d_port=d_port,
                    mpi_default=self.mpi_default,
                    first_job_id=_first_job_id(),
                )
            )
        self._daemon(
            "munged",
            ["munged", "--foreground", "--force", f"--socket={d}/munge/socket"]
            + [f"--key-file={key}", f"--pid-file={d}/munge/pid", f"--log-file={d}/log/munged.log"]
            + [f"--seed-file={d}/munge/seed"],
        )
        self._wait_for(lambda: os.path.exists(f"{d}/munge/socket"), "munged's socket")
        self._daemon("slurmctld", self._on("head", ["slurmctld", "-D", "-i", "-f", self.conf]))
        for node in self.nodes:
            # a TmpFS of the node's own: the PMIx plugin's directories are named by job alone
            setup = "" if self.vc is None else _cgroup_mounts()
            setup += f"mount --bind {d}/tmp/{node} {d}/nodetmp && " if self.vc else ""
            argv = ["slurmd", "-D", "-f", self.conf] + (["-N", node] if self.vc else [])
            self._daemon(f"slurmd-{node}", self._on(node, argv, setup))
        self._wait_for(self._idle, "the nodes to be idle in sinfo")

    def _wait_for(self, ready, what):
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited {proc.returncode}:\n{self.logs()}")
            if ready():
                return
            time.sleep(0.3)
        raise RuntimeError(f"waited {START_TIMEOUT} s for {what}:\n{self.logs()}")

    def _idle(self):
        out = self.run(["sinfo", "-h", "-N", "-o", "%t"], timeout=STEP_TIMEOUT, check=False)
        states = out.stdout.split()
        return out.returncode == 0 and states == ["idle"] * len(self.nodes)

    def logs(self):
        """The daemons' logs, for a failure's message."""
        parts = []
        names = ["munged.out", "slurmctld.log", "slurmctld.out"]
        for node in self.nodes:
            names += [f"slurmd-{node}.log", f"slurmd-{node}.out"]
        for name in names:
            path = os.path.join(self.dir or "", "log", name)
            if os.path.exists(path):
                with open(path, errors="replace") as f:
                    parts.append(f"== {name}\n" + "".join(f.readlines()[-30:]))
        return "\n".join(parts)

    def close(self):
        """Cancel the jobs, end the daemons and every process of this cluster, remove the
        directory (safe to call twice)."""
        if self.dir is None:
            return
        if self.procs.get("slurmctld") is not None and self.procs["slurmctld"].poll() is None:
            self.run(["scancel", "--full", "--user=root"], timeout=STEP_TIMEOUT, check=False)
        for name in [f"slurmd-{n}" for n in self.nodes] + ["slurmctld", "munged"]:
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for _ in range(3):  # slurmstepd, job steps and their children
            pids = _pids_marked(self.dir)
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = None

    # -- running commands
    def run(self, argv, timeout, check=True, env=None, cwd=None):
        """Run a client command (or srun's job) to its end under ``timeout`` seconds; its
        CompletedProcess (text). ``check``: raise naming its output when it exits non-zero."""
        proc = subprocess.run(
            self._on("head", argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env() if env is None else env,
            cwd=cwd,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(
                f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
            )
        return proc

    def job_state(self, job_id):
        """The job's state as slurmctld knows it now (PENDING, RUNNING, COMPLETED ...), ""
        once it has forgotten the job, or None when slurmctld did not answer (on a loaded
        machine squeue and scontrol can time out: a poll takes that as not known yet, not as
        a state)."""
        out = self.run(
            ["squeue", "-h", "-j", str(job_id), "-o", "%T"], timeout=STEP_TIMEOUT, check=False
        )
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0]
        out = self.run(["scontrol", "show", "job", str(job_id)], timeout=STEP_TIMEOUT, check=False)
        for word in out.stdout.split():
            if word.startswith("JobState="):
                return word.split("=", 1)[1]
        if out.returncode != 0 and "Invalid job id" not in out.stderr:
            return None
        return ""

    def wait_job(self, job_id, states, timeout):
        """Wait until the job is in one of ``states``; its state."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.job_state(job_id)
            if state in states:
                return state
            time.sleep(0.5)
        raise TimeoutError(
            f"job {job_id} is {self.job_state(job_id)!r}, not in {states}, after {timeout} s"
        )

    def completed(self):
        """``sacct -c``'s lines (JobID, JobName, State, ExitCode) from the job completion log:
        without slurmdbd, jobs only, not their steps."""
        out = self.run(
            ["sacct", "-c", "-n", "-P", "-o", "JobID,JobName,State,ExitCode"],
            timeout=STEP_TIMEOUT,
        )
        return [line.split("|") for line in out.stdout.splitlines() if line.strip()]
