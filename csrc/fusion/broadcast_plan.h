// The broadcast planner of synchronize_: a pure function from tensors' byte sizes and device
// types to an ordered list of broadcasts. Large tensors travel alone, from and into their own
// memory; small ones are packed into flat byte buffers up to a cap, one broadcast per buffer.
// Broadcast moves bytes, so one buffer holds tensors of every dtype; buffers are per device
// type because each device type has its own backend. It never sees MPI or tensors' data, so it
// is tested on its own; every rank whose tensors agree in shape, dtype and device type (see
// tensors_hash) computes the same plan.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace fluxmpi {

struct BroadcastPlanOptions {
  // A packed buffer holds at most this many bytes.
  std::int64_t bucket_bytes = std::int64_t(64) << 20;
  // Tensors of at least this many bytes are broadcast alone, in place: there one call's
  // latency (about 5-10 us over shared memory or InfiniBand) is cheaper than copying the
  // bytes in on the root and out on the others (2 x 64 KiB at ~13 GB/s is ~10 us).
  std::int64_t direct_bytes = std::int64_t(64) << 10;
  // Pack CPU tensors of any size up to bucket_bytes (direct_bytes then applies to other
  // devices only). Worth it only where every packed step is held in place (steps_in_place in
  // ops/flat_storage.h): then a ResNet-50's 161 tensors travel in two broadcasts, not ~100.
  bool pack_cpu = false;
};

// One broadcast: a tensor alone (`direct`) or a packed buffer of `bytes` bytes holding
// `members` at 64-byte aligned offsets, in order.
struct BroadcastStep {
  bool direct = false;
  c10::DeviceType device = c10::DeviceType::CPU;
  std::vector<std::size_t> members;
  std::int64_t bytes = 0;
};

// Offsets inside a packed buffer are aligned so that a slice can be viewed as any dtype.
constexpr std::int64_t kAlign = 64;

inline std::int64_t align_up(std::int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

inline std::int64_t nbytes_of(const at::Tensor& t) {
  return t.numel() * static_cast<std::int64_t>(t.element_size());
}

// The broadcasts for `tensors`, from their byte sizes and device types only. Empty tensors are
// skipped.
std::vector<BroadcastStep> plan_broadcast(const std::vector<at::Tensor>& tensors,
                                          const BroadcastPlanOptions& opts);

// A hash of the options that every rank's plan depends on (bucket_bytes and direct_bytes;
// pack_cpu is each rank's own choice, voted on separately), folded into `seed`.
std::int64_t plan_options_hash(const BroadcastPlanOptions& opts, std::int64_t seed = 0);

// What the pass before the agreement learns of one tensor, so that the data movement after
// it reads no TensorImpl again (on a cold cache, a second pass over a thousand of them cost
// ~30 us). `storage` is null unless the tensor is a contiguous CPU tensor with storage.
struct Probe {
  const c10::StorageImpl* storage = nullptr;
  const char* data = nullptr;  // its first byte
  std::int64_t nbytes = 0;
};

// A hash of every tensor's shape, dtype and device type, in order (for agreement). With
// `probes`, it is also filled, one per tensor, in the same pass.
std::int64_t tensors_hash(const std::vector<at::Tensor>& tensors, std::int64_t seed = 0,
                          std::vector<Probe>* probes = nullptr);

}  // namespace fluxmpi
