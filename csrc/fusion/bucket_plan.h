// The bucket planner: a pure function from tensor metadata to an ordered list of buckets.
// It never sees MPI or tensors' data, so it is tested on its own. Every rank computes the same
// plan from the same metadata; the plan's order is the order collectives are issued in.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <vector>

namespace fluxmpi {

struct TensorMeta {
  c10::ScalarType dtype;
  c10::Device device;
  std::int64_t numel;
};

struct Bucket {
  // Indices into the planner's input, in the order they were given (the expected order in
  // which backward produces them).
  std::vector<std::int64_t> members;
  // Element offset of each member inside the bucket's flat buffer (fused buckets only).
  std::vector<std::int64_t> offsets;
  c10::ScalarType dtype;
  c10::Device device;
  std::int64_t numel = 0;
  // A direct bucket holds one large tensor that is reduced in its own storage: no flat
  // buffer and no copies. Fused buckets hold small tensors as views of one flat buffer.
  bool direct = false;
};

// direct_min_bytes / cuda_direct_min_bytes that no tensor reaches: every tensor is fused.
inline constexpr std::int64_t kNeverDirect = std::int64_t{1} << 62;

struct PlanOptions {
  std::int64_t cap_bytes = 25 << 20;  // a fused bucket never exceeds this (bytes)
  // Host tensors at least this large go direct (bytes): reduced in their own storage, one
  // MPI call each (measured on CPU: no copy beats fewer calls there).
  std::int64_t direct_min_bytes = 1 << 20;
  // CUDA tensors at least this large go direct. By default none does: as in DDP every CUDA
  // gradient is a view of a fused bucket, so a bucket is one pack and one NCCL call (issue
  // 31: one call per large gradient was one cause of the 2.2-2.8x against DDP). Not yet
  // measured on a GPU.
  std::int64_t cuda_direct_min_bytes = kNeverDirect;
  // The first fused bucket of each dtype and device closes at this many bytes instead of
  // cap_bytes (DDP makes it 1 MiB, so that the first reduction starts early in backward).
  // 0: no smaller first bucket.
  std::int64_t first_cap_bytes = 0;
};

// The one check of the limits (ValueError naming the argument): run where Python builds a
// PlanOptions (DistributedOptimizer and allreduce_gradients, before their first collective)
// and by plan_buckets, since the fields stay writable.
void check_bucket_options(const PlanOptions& opts);

// Buckets in issue order: a fused bucket is emitted when it closes (the next tensor of its
// dtype and device would overflow the cap: first_cap_bytes for the first bucket of each
// dtype and device when set, cap_bytes after), so earlier-produced gradients go first.
// A tensor goes direct at direct_min_bytes on the host, cuda_direct_min_bytes on CUDA.
// Sizes count element_bytes an element, the bytes the path's buffers hold per value: 0 for
// the tensor's dtype (the default path, the exact path at one pass a step), 8 for the exact
// path's int64 sums. Buckets stay per dtype and device either way. direct=false: no tensor
// goes direct (a path that copies every value into its buffers, as the int64 sums do).
std::vector<Bucket> plan_buckets(const std::vector<TensorMeta>& tensors, const PlanOptions& opts,
                                 std::int64_t element_bytes = 0, bool direct = true);

}  // namespace fluxmpi
