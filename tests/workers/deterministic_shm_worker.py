"""DistributedOptimizer(deterministic=True) steps on one host, which take the grouped
shared-memory collectives (csrc/backend/mpi_shared_pieces.cpp): one backward pass a step (the
sharded path: the owners' reductions) and four (the int64 path), then a grouped allreduce and
a reduce-scatter large enough for the same memory. Prints the parameters' digest
and how many calls went through shared memory: tests/test_shm_full.py compares a run with room
in /dev/shm and one without (the same digest, no shared call), tests/test_reproducible.py reads
a run's stderr (no Error line from Open MPI)."""

import hashlib

import torch
import torch.nn.functional as F

import fluxmpi_py as fm
from fluxmpi_py._core import C

fm.Init(verbose=False)
rank, world = fm.local_rank(), fm.total_workers()
digest = hashlib.sha256()
for passes in (1, 4):  # micro-batches a rank a step: the sharded path, then the int64 path
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(128, 64), torch.randint(0, 2, (128,)))
    s = fm.DistributedSampler(data, global_batch_size=4 * passes * world, micro_batch_size=4)
    model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 2))
    opt = fm.DistributedOptimizer(
        torch.optim.AdamW(model.parameters()),
        module=model,
        deterministic=True,
        backward_passes_per_step=s.micro_batches_per_rank,
    )
    for i, (x, y) in enumerate(torch.utils.data.DataLoader(data, batch_size=4, sampler=s)):
        F.cross_entropy(model(x), y).backward()
        if (i + 1) % s.micro_batches_per_rank == 0:
            opt.step()
            opt.zero_grad()
    for p in model.parameters():
        digest.update(p.detach().numpy().tobytes())
# 2 MiB of a grouped allreduce and of a reduce-scatter: each through the shared memory
ts = fm.grouped_allreduce_([torch.full((300000,), rank + 1.0), torch.arange(224288.0)])
assert ts[0].eq(world * (world + 1) / 2).all() and ts[1].equal(torch.arange(224288.0) * world)
part = fm.reduce_scatter(torch.arange(world * 131072.0) + rank).flatten()  # row r: rank r's
first = 131072.0 * rank * world + world * (world - 1) / 2
assert part.equal(torch.arange(131072.0) * world + first), (rank, part[:4])
for t in ts + [part]:
    digest.update(t.numpy().tobytes())
print(
    f"rank {rank} digest {digest.hexdigest()[:16]} owner {C.shared_owner_parts_calls()} "
    f"scatter {C.shared_reduce_scatter_calls()} ring {C.ring_calls()}",
    flush=True,
)
