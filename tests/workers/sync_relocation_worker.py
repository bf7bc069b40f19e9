"""synchronize_ of a module whose parameters it relocates into flat storages: later broadcasts
in place without copies, large parameters packed once, replaced layers re-homed, shared
storages skipped, and the cached walk of the module kept up to date (the rest of synchronize_:
sync_worker.py, sync_values_worker.py).
"""

import os
import sys

import numpy
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import raises as expect_raise  # noqa: E402
from sync_worker import (  # noqa: E402
    Net,
    R,
    W,
    assert_like,
    fill,
    identical_everywhere,
    roots,
    shares_one_storage,
)

import fluxmpi_py as fm  # noqa: E402


def case_relocation_then_in_place_broadcasts():
    # The first call moves the small parameters into one flat storage (with >1 rank); later
    # calls broadcast it in place. The objects, values, leaf-ness and autograd stay intact.
    m = Net()
    fill(m, R())
    before = [id(p) for p in m.parameters()]
    fm.synchronize_(m, root_rank=0)
    params = list(m.parameters())
    assert [id(p) for p in params] == before
    assert_like(m, 0)
    if W() > 1:
        assert shares_one_storage(params), "small parameters were not relocated"
    assert not shares_one_storage(list(m.buffers())[:2])  # buffers never move
    assert all(p.is_leaf and p.requires_grad for p in params)
    for root in roots():
        fill(m, R() + 7)  # in place, into the relocated storage
        fm.synchronize_(m, root_rank=root)
        ref = Net()
        fill(ref, root + 7)
        for (n, a), (_, b) in zip(m.state_dict().items(), ref.state_dict().items()):
            assert torch.equal(a, b), (n, root)
    # Gradients and an optimizer step still work on relocated parameters.
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m(torch.ones(4, 4)).sum().backward()
    assert all(p.grad is not None and p.grad.shape == p.shape for p in m.parameters())
    opt.step()
    for p in m.parameters():
        identical_everywhere(p)


def case_relocated_model_broadcasts_without_copies():
    # A model of small parameters only: after the first call nothing is copied, even though a
    # Python storage object was made for every parameter beforehand (as torch.save does).
    from fluxmpi_py._core import C

    m = nn.Sequential(*[nn.Linear(16, 16) for _ in range(30)])
    with torch.no_grad():
        for p in m.parameters():
            p.fill_(R())
    storages = [p.untyped_storage() for p in m.parameters()]
    del storages
    fm.synchronize_(m, root_rank=0)
    if W() > 1:
        assert shares_one_storage(list(m.parameters()))
    for root in roots():
        with torch.no_grad():
            for p in m.parameters():
                p.fill_(R() + 3)
        copied, in_place = C.sync_copy_counters()
        fm.synchronize_(m, root_rank=root)
        copied2, in_place2 = C.sync_copy_counters()
        assert all(bool((p == root + 3).all()) for p in m.parameters())
        if W() > 1:
            assert copied2 == copied, f"{copied2 - copied} bytes copied"
            assert in_place2 - in_place >= sum(p.numel() * 4 for p in m.parameters())
    # A storage object someone holds is a holder: the home is then left alone (copies again).
    held = m[0].weight.untyped_storage()
    copied, _ = C.sync_copy_counters()
    fm.synchronize_(m, root_rank=0)
    assert held.data_ptr() == m[0].weight.untyped_storage().data_ptr()
    if W() > 1:
        assert C.sync_copy_counters()[0] > copied


def all_identical(model):
    # In a function: a tensor of the state_dict left in a caller's variable would hold the
    # flat storage, which rightly stops in-place broadcasts.
    for t in model.state_dict().values():
        identical_everywhere(t)


def case_large_parameters_travel_packed_once_relocated():
    # A 256 KiB weight is over direct_bytes (64 KiB). Relocated with the small parameters into
    # one flat storage, it then travels in the same in-place broadcast as they do.
    from fluxmpi_py._core import C

    m = nn.Sequential(nn.Linear(256, 256), nn.Linear(256, 4))
    fill(m, R())
    fm.synchronize_(m, root_rank=0)
    params = list(m.parameters())
    if W() > 1:
        assert shares_one_storage(params), "the large parameter was not relocated"
    for root in roots():
        fill(m, R() + 3)
        copied, in_place = C.sync_copy_counters()
        fm.synchronize_(m, root_rank=root)
        all_identical(m)
        copied2, in_place2 = C.sync_copy_counters()
        if W() > 1:
            assert copied2 == copied, f"{copied2 - copied} bytes copied"
            assert in_place2 - in_place >= sum(p.numel() * 4 for p in params), "not packed"
    # One rank holds an alias of the large weight's storage: it cannot take that step in
    # place, so it vetoes packing and every rank sends the large weight alone. No hang, the
    # values are the root's, and the alias still aliases.
    m2 = nn.Sequential(nn.Linear(256, 256), nn.Linear(256, 4))
    fill(m2, R())
    alias = m2[0].weight.detach() if R() == W() - 1 else None
    for _ in range(2):
        fm.synchronize_(m2, root_rank=0)
        all_identical(m2)
    if alias is not None:
        assert alias.data_ptr() == m2[0].weight.data_ptr()
        assert torch.equal(alias, m2[0].weight.detach())
    del alias  # released: the next calls may relocate and pack again
    # relocate differs between ranks (each rank's own argument): the ranks that would pack see
    # the others' veto, and every rank sends the large weight alone. No hang, right values.
    m3 = nn.Sequential(nn.Linear(256, 256), nn.Linear(256, 4))
    for i in range(3):
        fill(m3, R() + i)
        fm.synchronize_(m3, root_rank=i % W(), relocate=(R() == 0))
        all_identical(m3)
    for root in roots():
        fill(m2, R() + 5)
        fm.synchronize_(m2, root_rank=root)
        all_identical(m2)


def case_replaced_layer_is_rehomed():
    # After relocation a layer is replaced (as when fine-tuning a new head). The old flat
    # storage is then held only by the remaining parameters: the next call moves them and the
    # new layer into a new flat storage, and later calls broadcast in place again.
    from fluxmpi_py._core import C

    m = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 3))
    fill(m, R())
    fm.synchronize_(m, root_rank=0)
    m[2] = nn.Linear(8, 5)
    fill(m, R() + 1)
    fm.synchronize_(m, root_rank=W() - 1)
    all_identical(m)
    if W() > 1:
        assert shares_one_storage(list(m.parameters())), "not moved into one new flat storage"
    fill(m, R() + 2)
    copied = C.sync_copy_counters()[0]
    fm.synchronize_(m, root_rank=0)
    all_identical(m)
    assert C.sync_copy_counters()[0] == copied, "copies after the move"


def case_parameter_moved_inside_its_flat_storage():
    # On one rank, a relocated parameter is re-pointed into the padding after its own slot: same
    # storage, same shape, another address. That rank's storage no longer has the plan's layout,
    # so it copies out of a packed buffer instead of receiving in place; every value is the
    # root's. bn.bias is not the parameter whose address anchors the layout (fc.weight is).
    from fluxmpi_py._core import C

    m = Net()
    fill(m, R())
    fm.synchronize_(m, root_rank=0)
    p = m.bn.bias  # 6 floats in a 64-byte slot: floats 8..13 of the slot are padding
    moved = R() == 1 and W() > 1
    if moved:
        assert shares_one_storage(list(m.parameters())), "not relocated"
        flat = torch.empty(0).set_(p.untyped_storage())
        k = p.storage_offset()
        p.data = flat[k + 8 : k + 14]
        del flat
    fill(m, R() + 9)
    copied = C.sync_copy_counters()[0]
    fm.synchronize_(m, root_rank=0)
    for t in m.state_dict().values():
        identical_everywhere(t)
    if moved:
        assert C.sync_copy_counters()[0] > copied, "the moved parameter was not copied"


def case_relocation_skips_shared_storage_and_can_be_turned_off():
    m = Net()
    fill(m, R())
    alias = m.fc.weight.detach()  # another tensor on fc.weight's storage
    view = m.head.bias.detach().numpy()  # numpy shares head.bias's memory through a detach
    fm.synchronize_(m, root_rank=0)
    assert_like(m, 0)
    assert alias.data_ptr() == m.fc.weight.data_ptr(), "a shared parameter was moved"
    assert view.ctypes.data == m.head.bias.data_ptr()
    assert float(view[0]) == float(m.head.bias.detach()[0])
    # Memory that others can see stays where it is: shared memory (share_memory_(), read by
    # other processes) and numpy's memory (from_numpy).
    sh = Net()
    fill(sh, R())
    sh.share_memory()
    arr = numpy.full(6, float(R()), dtype=numpy.float32)
    sh.fc.bias = nn.Parameter(torch.from_numpy(arr))
    ptrs = [p.data_ptr() for p in sh.parameters()]
    fm.synchronize_(sh, root_rank=0)
    assert [p.data_ptr() for p in sh.parameters()] == ptrs, "shared or numpy memory was moved"
    assert all(p.is_shared() for n_, p in sh.named_parameters() if n_ != "fc.bias")
    assert float(arr[0]) == float(sh.fc.bias.detach()[0])  # still numpy's memory
    all_identical(sh)
    n = Net()
    fill(n, R())
    ptrs = [p.data_ptr() for p in n.parameters()]
    fm.synchronize_(n, root_rank=W() - 1, relocate=False)
    assert [p.data_ptr() for p in n.parameters()] == ptrs
    assert_like(n, W() - 1)


def case_cached_walk_sees_modules_change():
    # synchronize_ caches a module's walk; every change to what the module holds must show.
    m = Net()
    fill(m, R())
    fm.synchronize_(m)
    m.fc = nn.Linear(4, 6)  # a new submodule, different values on every rank
    with torch.no_grad():
        m.fc.weight.fill_(R() + 1.0)
    m.register_buffer("extra", torch.full((3,), float(R())))
    old_bias = m.head.bias  # relocated, and still held here (as an optimizer would)
    old_value = old_bias.detach().clone()
    m.head.bias = nn.Parameter(torch.full((3,), 10.0 + R()))
    m.bn.running_mean.fill_(float(R()))
    fm.synchronize_(m, root_rank=W() - 1)
    assert torch.equal(m.fc.weight.detach(), torch.full((6, 4), float(W())))
    assert torch.equal(m.extra, torch.full((3,), float(W() - 1)))
    assert torch.equal(m.head.bias.detach(), torch.full((3,), 10.0 + W() - 1))
    assert torch.equal(m.bn.running_mean, torch.full((6,), float(W() - 1)))
    assert torch.equal(old_bias.detach(), old_value), "a parameter no longer in the module changed"
    # .data replaced after relocation: a new storage, still synchronized
    m.head.weight.data = torch.full((3, 6), float(R()))
    fm.synchronize_(m, root_rank=0)
    assert torch.equal(m.head.weight.detach(), torch.zeros(3, 6))
    # A parameter removed and put back: its dict was modified (a new version tag) but holds the
    # same objects in the same order, so the cached walk still serves, with the right values.
    bias = m.head.bias
    del m.head.bias
    m.head.bias = bias
    fill(m, R() + 5)
    fm.synchronize_(m, root_rank=W() - 1)
    for t in m.state_dict().values():
        identical_everywhere(t)
    # The same bytes seen in another shape on one rank (same storage, same offset): the data
    # could land, but the shapes disagree with the root's, so it raises everywhere.
    fm.synchronize_(m, root_rank=0)
    if R() == 1:
        m.head.weight.data = m.head.weight.data.view(6, 3)
    keep = [t.detach().clone() for t in m.state_dict().values()]
    if W() > 1:
        expect_raise(ValueError, lambda: fm.synchronize_(m, root_rank=0), "head.weight")
        assert all(torch.equal(a, b) for a, b in zip(keep, m.state_dict().values()))
    if R() == 1:
        m.head.weight.data = m.head.weight.data.view(3, 6)
    # A shape that differs from the root's after relocation: raises everywhere, changes nothing
    if R() == 1:
        m.head.bias.data = torch.zeros(4)
    keep = [t.detach().clone() for t in m.state_dict().values()]
    if W() > 1:
        expect_raise(ValueError, lambda: fm.synchronize_(m, root_rank=0), "head.bias")
        assert all(torch.equal(a, b) for a, b in zip(keep, m.state_dict().values()))


if __name__ == "__main__":
    from harness import run_cases

    run_cases(globals())
