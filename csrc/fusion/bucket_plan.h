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

struct PlanOptions {
  std::int64_t cap_bytes = 25 << 20;        // a fused bucket never exceeds this (bytes)
  std::int64_t direct_min_bytes = 1 << 20;  // tensors at least this large go direct (bytes)
};

// Buckets in issue order: a fused bucket is emitted when it closes (the next tensor of its
// dtype and device would overflow the cap), so earlier-produced gradients go first.
std::vector<Bucket> plan_buckets(const std::vector<TensorMeta>& tensors, const PlanOptions& opts);

}  // namespace fluxmpi
