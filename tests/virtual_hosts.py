"""A cluster of virtual hosts on this machine, for running MPI jobs across hosts in tests.

Each host is a network namespace (``ip netns``) with its own hostname (a UTS namespace made
by ``unshare --uts``) and one veth link to a bridge. The bridge lives in a namespace of its
own, ``head``, where ``mpiexec`` runs: Open MPI starts its daemon (orted) on every host
through a launch agent script (MCA ``plm_rsh_agent``) that enters the host's namespaces, as
ssh would enter a real machine. Only TCP connects the hosts; ranks of one host share memory.

    with VirtualCluster(hosts=2) as cluster:
        rc, out = cluster.mpiexec(["python", "worker.py"], ranks_per_host=2, timeout=120)

Namespaces are machine-wide, so every name carries this process's id (``fxmh<pid>...``); a
cluster left behind by a killed process is removed by the next one (``remove_stale``), and
``close()`` removes this one's, killing whatever still runs in it. Needs root (or
CAP_SYS_ADMIN and CAP_NET_ADMIN); ``unavailable_reason()`` says why a cluster cannot be made.
"""

import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import tempfile
import time

PREFIX = "fxmh"  # the names of every namespace this module makes start with it
STEP_TIMEOUT = 20  # seconds for one ip/tc command
SUBNET = "10.231.7"  # inside the head namespace only: no clash with the machine's addresses


def _sh(args, timeout=STEP_TIMEOUT, check=True):
    """Run a command (a list), bounded in time; return its CompletedProcess."""
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


def _alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _namespaces():
    out = _sh(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _kill_namespace(ns):
    """SIGKILL every process in namespace `ns`, then delete it and its /etc/netns files."""
    pids = _sh(["ip", "netns", "pids", ns], check=False).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    _sh(["ip", "netns", "delete", ns], check=False)
    shutil.rmtree(os.path.join("/etc/netns", ns), ignore_errors=True)


def remove_stale():
    """Delete the namespaces of clusters whose creating process has died."""
    for ns in _namespaces():
        m = re.match(rf"{PREFIX}(\d+)-", ns)
        if m and not _alive(int(m.group(1))):
            _kill_namespace(ns)


def unavailable_reason():
    """None when this machine lets us make namespaces, veth links and a bridge; else why not."""
    for tool in ("ip", "unshare", "tc", "mpiexec"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    probe = f"{PREFIX}{os.getpid()}-probe"
    try:
        _sh(["ip", "netns", "add", probe])
        _sh(["ip", "netns", "exec", probe, "ip", "link", "add", "br0", "type", "bridge"])
        _sh(["ip", "netns", "exec", probe, "unshare", "--uts", "hostname", "probe"])
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        return f"this machine does not permit network namespaces here: {e}"
    finally:
        _sh(["ip", "netns", "delete", probe], check=False)
    return None


AGENT = """#!/bin/sh
# Open MPI's launch agent (plm_rsh_agent): called like ssh, `agent HOST COMMAND...`; runs the
# command in HOST's network namespace under HOST's hostname.
host="$1"; shift
case "$host" in
{cases}
  *) echo "launch agent: unknown host $host" >&2; exit 2 ;;
esac
exec ip netns exec "$ns" unshare --uts -- sh -c 'hostname "$0" && eval "$1"' "$host" "$*"
"""


class VirtualCluster:
    """`hosts` virtual hosts named node0, node1, ... on one bridge, plus the head namespace
    where mpiexec runs. A context manager: leaving it removes every namespace it made."""

    def __init__(self, hosts=2):
        self.hosts = [f"node{i}" for i in range(hosts)]
        self.tag = f"{PREFIX}{os.getpid()}-{int(time.time() * 1000) % 100000}"
        self.head = f"{self.tag}-head"
        self.namespaces = {h: f"{self.tag}-{h}" for h in self.hosts}
        self.address = {h: f"{SUBNET}.{10 + i}" for i, h in enumerate(self.hosts)}
        self.dir = None

    # -- making and removing
    def __enter__(self):
        remove_stale()
        self.dir = tempfile.mkdtemp(prefix="fluxmpi-hosts-")
        try:
            self._make()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def _in(self, ns, *args, check=True):
        return _sh(["ip", "netns", "exec", ns, *args], check=check)

    def _make(self):
        etc_hosts = f"127.0.0.1 localhost\n{SUBNET}.1 head\n" + "".join(
            f"{a} {h}\n" for h, a in self.address.items()
        )
        for ns in [self.head, *self.namespaces.values()]:
            _sh(["ip", "netns", "add", ns])
            # `ip netns exec` mounts /etc/netns/NS/hosts over /etc/hosts: names resolve inside
            os.makedirs(os.path.join("/etc/netns", ns), exist_ok=True)
            with open(os.path.join("/etc/netns", ns, "hosts"), "w") as f:
                f.write(etc_hosts)
            self._in(ns, "ip", "link", "set", "lo", "up")
        self._in(self.head, "ip", "link", "add", "br0", "type", "bridge")
        self._in(self.head, "ip", "addr", "add", f"{SUBNET}.1/24", "dev", "br0")
        self._in(self.head, "ip", "link", "set", "br0", "up")
        for h, ns in self.namespaces.items():
            port = f"p-{h}"
            _sh(
                ["ip", "link", "add", "eth0", "netns", ns, "type", "veth"]
                + ["peer", "name", port, "netns", self.head]
            )
            self._in(ns, "ip", "addr", "add", f"{self.address[h]}/24", "dev", "eth0")
            self._in(ns, "ip", "link", "set", "eth0", "up")
            self._in(self.head, "ip", "link", "set", port, "master", "br0")
            self._in(self.head, "ip", "link", "set", port, "up")
        cases = "".join(f"  {h}) ns={ns} ;;\n" for h, ns in self.namespaces.items())
        self.agent = os.path.join(self.dir, "agent.sh")
        with open(self.agent, "w") as f:
            f.write(AGENT.format(cases=cases))
        os.chmod(self.agent, stat.S_IRWXU)

    def close(self):
        """Kill what runs in the namespaces and delete them (safe to call twice)."""
        for ns in [*self.namespaces.values(), self.head]:
            _kill_namespace(ns)
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    # -- shaping and reading the links
    def shape(self, gbit=None, delay_us=None):
        """Shape every host's link (its egress): `gbit` Gbit/s and a one-way delay of
        `delay_us` microseconds with tc netem; where the kernel lacks netem, the rate alone
        with tc tbf. None for both removes the shaping. Returns what was applied, in words."""
        applied = "unshaped veth"
        for ns in self.namespaces.values():
            self._in(ns, "tc", "qdisc", "del", "dev", "eth0", "root", check=False)
            if gbit is None and delay_us is None:
                continue
            netem = ["tc", "qdisc", "add", "dev", "eth0", "root", "netem", "limit", "100000"]
            if delay_us:
                netem += ["delay", f"{delay_us}us"]
            if gbit:
                netem += ["rate", f"{gbit}gbit"]
            if self._in(ns, *netem, check=False).returncode == 0:
                applied = f"netem {gbit} Gbit/s, {delay_us} us"
                continue
            if not gbit:
                raise RuntimeError("this kernel has no netem qdisc: a delay cannot be added")
            burst = max(64 << 10, int(gbit * 1e9 / 8 / 1000))  # 1 ms at the rate, >= a GSO packet
            self._in(
                ns,
                "tc",
                "qdisc",
                "add",
                "dev",
                "eth0",
                "root",
                "tbf",
                "rate",
                f"{gbit}gbit",
                "burst",
                str(burst),
                "latency",
                "10ms",
            )
            applied = f"tbf {gbit} Gbit/s (no netem in this kernel: no added delay)"
        return applied

    def sent_bytes(self):
        """{host: bytes its eth0 has sent so far}: what crossed the TCP links."""
        return {
            h: int(self._in(ns, "cat", "/sys/class/net/eth0/statistics/tx_bytes").stdout)
            for h, ns in self.namespaces.items()
        }

    # -- running
    def _slots(self, ranks_per_host):
        """Ranks on each host: one count for all, or a list of one count per host."""
        if isinstance(ranks_per_host, int):
            return [ranks_per_host] * len(self.hosts)
        assert len(ranks_per_host) == len(self.hosts), (ranks_per_host, self.hosts)
        return list(ranks_per_host)

    def hostfile(self, ranks_per_host):
        slots = self._slots(ranks_per_host)
        path = os.path.join(self.dir, "hostfile-" + "-".join(map(str, slots)))
        with open(path, "w") as f:
            f.writelines(f"{h} slots={n}\n" for h, n in zip(self.hosts, slots))
        return path

    def mpiexec_command(self, argv, ranks_per_host, mca=()):
        """The mpiexec command line (run it in the head namespace) for `ranks_per_host` ranks
        on every host (or a list: so many on each host), ranks filling node0 first; TCP between
        hosts, shared memory within."""
        net = f"{SUBNET}.0/24"
        params = [
            ("plm_rsh_agent", self.agent),
            ("plm_rsh_no_tree_spawn", "1"),
            ("pml", "ob1"),
            ("btl", "tcp,vader,self"),
            ("btl_tcp_if_include", net),
            ("oob_tcp_if_include", net),
            *mca,
        ]
        cmd = ["mpiexec", "--hostfile", self.hostfile(ranks_per_host)]
        cmd += ["-n", str(sum(self._slots(ranks_per_host))), "--map-by", "slot"]
        for k, v in params:
            cmd += ["--mca", k, str(v)]
        return cmd + list(argv)

    def start_on_head(self, cmd, env=None):
        """Start `cmd` (a list) in the head namespace, under the hostname `head`, in a session
        of its own; its output (stdout and stderr together) is the Popen's stdout, as text."""
        inner = f"hostname head && exec {shlex.join(cmd)}"
        return subprocess.Popen(
            ["ip", "netns", "exec", self.head, "unshare", "--uts", "--", "sh", "-c", inner],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,
        )

    def cut(self, host):
        """Cut `host` off mid-run, as a failed switch port would: its link leaves the bridge, so
        packets either way vanish while both ends stay up (no error reaches either side; taking
        eth0 down instead fails the host's sends at once, and its ranks abort by themselves)."""
        self._in(self.head, "ip", "link", "set", f"p-{host}", "nomaster")

    def pids(self, host, contains=""):
        """The processes running on `host` whose command line contains `contains`."""
        found = []
        for pid in _sh(["ip", "netns", "pids", self.namespaces[host]], check=False).stdout.split():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue  # it ended meanwhile
            if contains in cmdline:
                found.append(int(pid))
        return found

    def mpiexec(self, argv, ranks_per_host, timeout, env=None, mca=()):
        """Run `argv` under mpiexec across the hosts; return (exit code, output, timed out).
        A job still running after `timeout` seconds is killed on every host."""
        proc = self.start_on_head(self.mpiexec_command(argv, ranks_per_host, mca), env)
        try:
            out, _ = proc.communicate(timeout=timeout)
            return proc.returncode, out, False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            for ns in self.namespaces.values():
                for pid in _sh(["ip", "netns", "pids", ns], check=False).stdout.split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except (ProcessLookupError, ValueError):
                        pass
            out, _ = proc.communicate()
            return proc.returncode, out, True
