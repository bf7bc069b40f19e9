"""fluxmpi_py across virtual hosts (tests/virtual_hosts.py): each host is a network namespace
with its own hostname, the hosts talk over TCP only. Launched by tests/test_multi_host.py
with HOSTS hosts of RANKS_PER_HOST ranks each, ranks filling node0 first.

Without arguments: the harness cases. With a mode, one rank (the last, on the last host)
fails while the others wait for it in a collective:
    raise   it raises an uncaught exception
    killed  it is killed by SIGKILL
"""

import os
import signal
import socket
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
import collectives_bad_input_worker  # noqa: E402
import collectives_worker  # noqa: E402
import optimizer_worker  # noqa: E402
import sync_worker  # noqa: E402
from harness import run_cases  # noqa: E402

import fluxmpi_py as fm  # noqa: E402
from fluxmpi_py._core import C  # noqa: E402

HOSTS = int(os.environ.get("FLUXMPI_TEST_HOSTS", "2"))
PER_HOST = int(os.environ.get("FLUXMPI_TEST_RANKS_PER_HOST", "2"))
GPU_LIST = [3, 5, 7, 9][:PER_HOST]  # Init(gpu_devices=...) for the GPU choice case

_chosen_devices = []


def init_as_if_on_gpu_hosts():
    """Init with torch.cuda pretending 8 GPUs per host, recording the device each rank takes
    (the logic of the GPU choice; nothing touches a GPU). Restores torch.cuda afterwards."""
    saved = torch.cuda.is_available, torch.cuda.device_count, torch.cuda.set_device
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 8
    torch.cuda.set_device = _chosen_devices.append
    try:
        fm.Init(gpu_devices=GPU_LIST)
    finally:
        torch.cuda.is_available, torch.cuda.device_count, torch.cuda.set_device = saved


def host_index():
    return fm.local_rank() // PER_HOST


def gather_ints(values):
    """Every rank's `values` (a list of ints), as a (world, len) tensor on every rank."""
    table = torch.zeros(fm.total_workers(), len(values), dtype=torch.int64)
    table[fm.local_rank()] = torch.tensor(values)
    return fm.allreduce_(table)


def case_ranks_hosts_and_node_local_ranks():
    r, n = fm.local_rank(), fm.total_workers()
    assert n == HOSTS * PER_HOST, (n, HOSTS, PER_HOST)
    assert socket.gethostname() == f"node{host_index()}", (r, socket.gethostname())
    assert fm.node_local_rank() == r % PER_HOST, (r, fm.node_local_rank())
    table = gather_ints([r, host_index(), fm.node_local_rank(), os.getpid()])
    assert table[:, 0].tolist() == list(range(n))
    assert table[:, 2].tolist() == [k % PER_HOST for k in range(n)], table


def case_gpu_choice_by_node_local_rank():
    # every host numbers its GPUs from its own first rank: gpu_devices[node_local_rank]
    assert _chosen_devices == [GPU_LIST[fm.node_local_rank()]], _chosen_devices
    table = gather_ints(_chosen_devices)
    assert table[:, 0].tolist() == [GPU_LIST[k % PER_HOST] for k in range(fm.total_workers())]


def eth0_sent_bytes():
    with open("/sys/class/net/eth0/statistics/tx_bytes") as f:
        return int(f.read())


def case_allreduce_crosses_the_tcp_link():
    # 8 MiB from every host must leave through its eth0: the data really crosses hosts
    t = torch.full((2 << 20,), float(fm.local_rank() + 1))
    fm.barrier()
    before = eth0_sent_bytes()
    fm.allreduce_(t)
    fm.barrier()
    sent = eth0_sent_bytes() - before
    n = fm.total_workers()
    assert torch.equal(t, torch.full_like(t, n * (n + 1) / 2))
    assert sent >= t.numel() * 4 // 2, f"rank {fm.local_rank()}: host sent only {sent} bytes"


def case_allreduce_every_dtype_op_size():
    collectives_worker.case_allreduce_every_dtype_op_size()


def case_allreduce_rank_plus_one():
    collectives_worker.case_allreduce_rank_plus_one()


def case_ring_allreduce_sizes_and_identical_bits():
    # the ring itself, allowed across hosts, with the node-aware path off
    saved = C.hierarchical_options()
    C.set_hierarchical_options(C.HierarchicalOptions(enabled=False, ring_across_hosts=True))
    try:
        collectives_worker.case_ring_allreduce_sizes_and_identical_bits()
    finally:
        C.set_hierarchical_options(saved)


def case_hierarchical_allreduce_every_dtype_op_size():
    # the node-aware path at every size: every dtype and op, results and bits as MPI's
    saved = C.hierarchical_options()
    C.set_hierarchical_options(C.HierarchicalOptions(min_bytes=0, max_bytes=1 << 62))
    before = C.hierarchical_calls()
    try:
        collectives_worker.case_allreduce_every_dtype_op_size()
        collectives_worker.case_allreduce_rank_plus_one()
        optimizer_worker.check_equivalent(optimizer_worker.SGD)
    finally:
        C.set_hierarchical_options(saved)
    assert C.hierarchical_calls() > before, "nothing took the node-aware path"


def case_default_choice_across_hosts():
    # The default options, chosen by measurement (docs/measurements.md, "Across hosts"): where a
    # host has more than one rank, allreduces from min_bytes below max_bytes take the
    # node-aware path, larger ones MPI_Allreduce, never the ring; with one rank per host the
    # ring's own thresholds decide, as on one host.
    o, r = C.hierarchical_options(), C.ring_options()
    n = fm.total_workers()
    neighbours = PER_HOST > 1
    for nbytes, node_aware, ring in [
        (o.min_bytes, neighbours, False),
        (o.max_bytes - 4, neighbours, False),
        (max(o.max_bytes, r.sum_min_bytes), False, not neighbours),
    ]:
        t = torch.full((nbytes // 4,), float(fm.local_rank()))
        hier, rings = C.hierarchical_calls(), C.ring_calls()
        fm.allreduce_(t)
        assert torch.equal(t, torch.full_like(t, n * (n - 1) / 2)), nbytes
        took = (C.hierarchical_calls() - hier, C.ring_calls() - rings)
        assert took == (int(node_aware), int(ring)), (nbytes, took, o, r)


def case_bcast_every_dtype_root_size():
    collectives_worker.case_bcast_every_dtype_root_size()


def case_reduce_every_dtype_op_root_size():
    collectives_worker.case_reduce_every_dtype_op_root_size()


def case_iallreduce_ibcast_wait_and_test():
    collectives_worker.case_iallreduce_ibcast_wait_and_test()


def case_mismatch_across_ranks():
    collectives_bad_input_worker.case_mismatch_across_ranks()


def case_distributed_optimizer_matches_one_process():
    optimizer_worker.check_equivalent(optimizer_worker.SGD)
    optimizer_worker.check_equivalent(optimizer_worker.ADAMW)


def case_large_gradients_reduced_in_place():
    optimizer_worker.case_large_gradients_reduced_in_place()


def case_synchronize_module_from_every_root():
    sync_worker.case_module_parameters_and_buffers_in_place()


def case_synchronize_adam_trained_on_root():
    sync_worker.case_adam_trained_on_root_fresh_elsewhere()


def fail(mode):
    """The last rank fails in `mode` while the others wait for it in an allreduce."""
    fm.Init()
    r, n = fm.local_rank(), fm.total_workers()
    t = torch.ones(1000)
    fm.allreduce_(t)  # everyone is up
    if r == n - 1:
        time.sleep(0.5)
        print(f"rank {r} on {socket.gethostname()} fails ({mode})", flush=True)
        if mode == "raise":
            raise RuntimeError(f"deliberate failure on rank {r}")
        os.kill(os.getpid(), signal.SIGKILL)
    print(f"rank {r} on {socket.gethostname()} waits in a collective", flush=True)
    fm.allreduce_(t)
    print(f"rank {r}: the collective returned, which it must not", flush=True)
    sys.exit(3)


if __name__ == "__main__":
    torch.set_num_threads(1)
    if len(sys.argv) > 1:
        fail(sys.argv[1])
    else:
        init_as_if_on_gpu_hosts()
        run_cases(globals())
