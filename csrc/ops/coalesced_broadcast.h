// synchronize_'s data movement: many tensors go from the root to every rank in a few
// broadcasts. Large contiguous tensors travel from and into their own memory (no copy on any
// rank); small ones are packed into flat byte buffers up to a cap, one broadcast per buffer.
// Parameters relocated into flat storage (ops/flat_storage.h) are packed whatever their
// size, when every rank holds them in place (synchronize_'s fast path votes on it).
// Broadcast moves bytes, so one buffer holds tensors of every dtype; buffers are per device
// type because each device type has its own backend.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ops/consensus.h"

namespace fluxmpi {

struct CoalescedOptions {
  // A packed buffer holds at most this many bytes.
  std::int64_t bucket_bytes = std::int64_t(64) << 20;
  // Tensors of at least this many bytes are broadcast alone, in place: there one call's
  // latency (about 5-10 us over shared memory or InfiniBand) is cheaper than copying the
  // bytes in on the root and out on the others (2 x 64 KiB at ~13 GB/s is ~10 us).
  std::int64_t direct_bytes = std::int64_t(64) << 10;
  // Move parameters that nothing else references into flat storage laid out like their
  // packed buffer, so that later broadcasts read and write them in place
  // (ops/flat_storage.h).
  bool relocate = false;
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

// Bytes this process copied into or out of packed buffers, and bytes of packed buffers it
// broadcast in place (a relocated home), since it started. For tests and benchmarks.
struct CopyCounters {
  std::int64_t copied = 0;
  std::int64_t in_place = 0;
};
CopyCounters copy_counters();

// Pure: the broadcasts for `tensors`, from their byte sizes and device types only, so every
// rank whose tensors agree on those computes the same plan. Empty tensors are skipped.
std::vector<BroadcastStep> plan_broadcast(const std::vector<at::Tensor>& tensors,
                                          const CoalescedOptions& opts);

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

// Data movement only: the root's tensors' bytes into every rank's tensors of the same
// position, in place. Callers have agreed that all ranks hold the same shapes and dtypes.
// Must run inline on the engine or on its thread.
// `plan`, when given, is plan_broadcast(tensors, opts), computed by the caller (a cache);
// `probes`, when given, come from tensors_hash on these tensors, since which nothing changed.
void coalesced_broadcast_data(const std::vector<at::Tensor>& tensors, int root,
                              const CoalescedOptions& opts,
                              const std::vector<BroadcastStep>* plan = nullptr,
                              const std::vector<Probe>* probes = nullptr);

// Agree first (kind CoalescedBroadcast: root, tensor count, shapes, and this rank's error
// `err` with message `err_text`, which raises on every rank), then move the data.
void coalesced_broadcast_checked(const std::vector<at::Tensor>& tensors, std::int64_t root,
                                 ErrorClass err, const std::string& err_text,
                                 const CoalescedOptions& opts);

}  // namespace fluxmpi
