"""Init's GPU choice (fluxmpi_py/_gpu_choice.py), without a GPU: which device each node-local
rank takes, and which ranks would share one (NCCL refuses that)."""

from __future__ import annotations

import pytest

from fluxmpi_py._gpu_choice import choose_gpu


@pytest.mark.parametrize(
    "node_size, count, want",
    [(1, 1, [0]), (2, 2, [0, 1]), (4, 2, [0, 1, 0, 1]), (3, 8, [0, 1, 2])],
)
def test_round_robin_by_node_rank(node_size, count, want):
    assert [choose_gpu(r, node_size, count).device for r in range(node_size)] == want


def test_no_gpu_no_device():
    c = choose_gpu(0, 4, 0)
    assert c.device is None and c.shared == {} and c.sharing_message() == ""


def test_more_ranks_than_gpus_names_who_shares():
    c = choose_gpu(1, 5, 2)
    assert c.shared == {0: (0, 2, 4), 1: (1, 3)}
    assert c.sharing_message() == (
        "node-local ranks 0, 2 and 4 share cuda:0; node-local ranks 1 and 3 share cuda:1 "
        "(5 ranks, 2 GPUs)"
    )
    assert choose_gpu(0, 2, 2).sharing_message() == ""


def test_gpu_devices_chosen_and_checked():
    assert [choose_gpu(r, 2, 4, gpu_devices=[3, 1]).device for r in range(2)] == [3, 1]
    assert choose_gpu(0, 2, 4, gpu_devices=[2, 2]).shared == {2: (0, 1)}
    with pytest.raises(ValueError, match=r"2 ranks run on this node, so it needs at least 2"):
        choose_gpu(0, 2, 4, gpu_devices=[0])
    with pytest.raises(ValueError, match=r"cuda:4 is not a GPU of this machine, which has 4"):
        choose_gpu(0, 2, 4, gpu_devices=[0, 4])
