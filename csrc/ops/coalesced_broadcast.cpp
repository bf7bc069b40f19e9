#include "ops/coalesced_broadcast.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <sstream>

#include "backend/select.h"
#include "fusion/pack_plan.h"
#include "ops/bucket_pack.h"
#include "ops/collectives.h"
#include "ops/flat_storage.h"
#include "runtime/environment.h"
#include "runtime/group.h"

namespace fluxmpi {

namespace {

std::atomic<std::int64_t> g_copied{0};    // bytes copied into or out of packed buffers
std::atomic<std::int64_t> g_in_place{0};  // bytes of packed buffers broadcast in place

// The slice of `buf` at `offset` seen as a tensor shaped like `t`.
at::Tensor slice_like(const at::Tensor& buf, std::int64_t offset, const at::Tensor& t) {
  return buf.narrow(0, offset, nbytes_of(t)).view(t.scalar_type()).view(t.sizes());
}

// Host tensors in a contiguous layout are copied with memcpy: at::copy_ costs microseconds
// of dispatch per tensor, which for a thousand small tensors is more than the copy itself.
bool plain_host(const at::Tensor& t) { return t.is_cpu() && t.is_contiguous(); }

// Copy the members of step `s` that do not already live at their slot of the packed buffer
// `buf` (a byte tensor) into it (`into`, the root) or out of it (the others). `lives` may be
// empty: then every member is copied. A member that lives at its slot is not read at all.
// Copying into a host buffer also zeroes the padding after the slot, so that the bytes on the
// wire are the members and zeros, not what the allocator left.
void copy_slots(const at::Tensor& buf, const std::vector<at::Tensor>& ts, const BroadcastStep& s,
                const std::vector<char>& lives, bool into, const std::vector<Probe>& probes) {
  auto* base = static_cast<char*>(buf.data_ptr());
  std::int64_t off = 0;
  for (std::size_t k = 0; k < s.members.size(); ++k) {
    const std::int64_t n = probes[s.members[k]].nbytes;
    if (lives.empty() || !lives[k]) {
      const auto& t = ts[s.members[k]];
      g_copied += n;
      if (into && buf.is_cpu()) {
        std::memset(base + off + n, 0, static_cast<std::size_t>(align_up(n) - n));
      }
      if (plain_host(t) && buf.is_cpu()) {
        if (into) {
          std::memcpy(base + off, t.data_ptr(), n);
        } else {
          std::memcpy(t.data_ptr(), base + off, n);
        }
      } else if (into) {
        slice_like(buf, off, t).copy_(t);
      } else {
        t.copy_(slice_like(buf, off, t));
      }
    }
    off += align_up(n);
  }
}

// A device step in one kernel launch each way (ops/bucket_pack.h): the members as bytes at the
// offsets copy_slots uses, from one pack plan. False, and nothing copied, when a member is not
// contiguous (copy_slots then copies it with its strides).
bool pack_step_on_device(const at::Tensor& buf, const std::vector<at::Tensor>& ts,
                         const BroadcastStep& s, bool into) {
  std::vector<PackSource> sources;
  std::vector<at::Tensor> bytes;
  std::int64_t copied = 0;
  for (auto m : s.members) {
    const auto& t = ts[m];
    if (!t.is_contiguous()) return false;
    sources.push_back({at::kByte, nbytes_of(t)});
    copied += nbytes_of(t);
    bytes.push_back(t.reshape({-1}).view(at::kByte));
  }
  const PackPlan plan = plan_pack(sources, at::kByte, kAlign);
  if (into) {
    pack(plan, bytes, buf);
  } else {
    unpack(plan, buf, bytes);
  }
  g_copied += copied;
  return true;
}

// Host staging kept between calls: fresh memory costs a page fault per 4 KiB on first touch,
// which for a few MiB takes as long as the broadcast itself. Only the engine uses it (one
// caller at a time). It holds at most one default bucket (64 MiB); larger ones are not kept.
constexpr std::int64_t kKeepBytes = std::int64_t(64) << 20;

at::Tensor host_staging(std::int64_t bytes) {
  // Leaked on purpose, like the engine: freeing it during static destruction could run
  // after the allocator is gone.
  static auto* kept = new at::Tensor();
  if (kept->defined() && kept->numel() >= bytes) return *kept;
  auto buf = at::empty({bytes}, at::TensorOptions().dtype(at::kByte));
  if (bytes <= kKeepBytes) *kept = buf;
  return buf;
}

std::string describe_error(std::size_t i, const at::Tensor& t, const std::string& why) {
  std::ostringstream s;
  s << "tensor " << i << " (shape " << t.sizes() << ", dtype " << t.scalar_type() << "): " << why;
  return s.str();
}

// Local checks: broadcast moves bytes, so any dtype is fine; layout and device are not.
ErrorClass validate(const std::vector<at::Tensor>& ts, std::string& msg) {
  for (std::size_t i = 0; i < ts.size(); ++i) {
    const auto& t = ts[i];
    if (!t.defined()) {
      msg = "tensor " + std::to_string(i) + " is undefined";
      return ErrorClass::Type;
    }
    if (t.layout() != c10::kStrided) {
      msg = describe_error(i, t, "only dense (strided) tensors can be synchronized");
      return ErrorClass::Type;
    }
    if (!device_supported(t)) {
      std::ostringstream s;
      s << "tensors on " << t.device() << " cannot be communicated by this build";
      msg = describe_error(i, t, s.str());
      return ErrorClass::Type;
    }
    if (t.is_cuda() && !cuda_refusal().empty()) {
      msg = describe_error(i, t, "NCCL cannot run here: " + cuda_refusal());
      return ErrorClass::Value;
    }
  }
  return ErrorClass::None;
}

}  // namespace

CopyCounters copy_counters() { return {g_copied.load(), g_in_place.load()}; }

void coalesced_broadcast_data(const std::vector<at::Tensor>& tensors, int root,
                              const CoalescedOptions& opts, const std::vector<BroadcastStep>* plan,
                              const std::vector<Probe>* probes) {
  // Parameters are leaves that require grad; writing the root's values is not a step of
  // any autograd graph, so any copy below runs without autograd.
  c10::AutoGradMode no_grad(false);
  const Group& e = current_group();
  if (e.size() == 1) return;
  bool is_root = e.rank() == root;
  std::vector<BroadcastStep> own;
  if (plan == nullptr) {
    own = plan_broadcast(tensors, opts.plan);
    plan = &own;
  }
  const auto& steps = *plan;
  std::vector<Probe> own_probes;
  if (probes == nullptr) {
    tensors_hash(tensors, 0, &own_probes);
    probes = &own_probes;
  }
  // One staging buffer per device type, as large as its largest bucket, reused by all; made
  // at its first use (steps in their home need none).
  std::map<c10::DeviceType, std::int64_t> need;
  for (const auto& s : steps) {
    if (!s.direct) need[s.device] = std::max(need[s.device], s.bytes);
  }
  std::map<c10::DeviceType, at::Tensor> staging;
  auto staging_for = [&](const BroadcastStep& s) -> const at::Tensor& {
    auto it = staging.find(s.device);
    if (it != staging.end()) return it->second;
    const std::int64_t bytes = need[s.device];
    return staging[s.device] =
               s.device == c10::DeviceType::CPU
                   ? host_staging(bytes)
                   : at::empty({bytes}, tensors[s.members[0]].options().dtype(at::kByte));
  };
  for (const auto& s : steps) {
    const auto& first = tensors[s.members[0]];
    Backend& b = backend_for(first);
    if (s.direct) {
      broadcast_data(b, first, root);
      continue;
    }
    if (s.device == c10::DeviceType::CPU) {
      Home home;
      if (find_home(*probes, s, home)) {  // the broadcast reads and writes it in place
        const bool copy = !home.all_live;
        if (is_root && copy) copy_slots(home.buf, tensors, s, home.lives, true, *probes);
        g_in_place += s.bytes;
        b.broadcast(home.base, s.bytes, at::kByte, root);
        if (!is_root && copy) copy_slots(home.buf, tensors, s, home.lives, false, *probes);
        continue;
      }
      std::vector<char> relocating(s.members.size(), 0);
      bool any = false;
      if (opts.relocate) {
        relocating = movable(tensors, s, *probes);
        any = std::find(relocating.begin(), relocating.end(), 1) != relocating.end();
      }
      if (any) {  // a new home (first call, or the parameters changed), which they adopt
        at::Tensor flat = new_flat(s.bytes);
        // The root fills every slot and zeroes the padding (not the whole step first: that took
        // ~10 ms for 64 MiB).
        if (is_root) copy_slots(flat, tensors, s, {}, true, *probes);
        b.broadcast(flat.data_ptr(), s.bytes, at::kByte, root);
        if (!is_root) copy_slots(flat, tensors, s, relocating, false, *probes);
        adopt(flat, tensors, s, relocating);
        continue;
      }
    }
    const auto& buf = staging_for(s);
    const bool device = s.device != c10::DeviceType::CPU;
    if (is_root && !(device && pack_step_on_device(buf, tensors, s, true))) {
      copy_slots(buf, tensors, s, {}, true, *probes);
    }
    b.broadcast(buf.data_ptr(), s.bytes, at::kByte, root);
    if (!is_root && !(device && pack_step_on_device(buf, tensors, s, false))) {
      copy_slots(buf, tensors, s, {}, false, *probes);
    }
  }
}

void check_plan_options(const BroadcastPlanOptions& opts, Signature& s, std::string& msg) {
  if (s.error == ErrorClass::None && (opts.bucket_bytes <= 0 || opts.direct_bytes <= 0)) {
    s.error = ErrorClass::Value;
    msg = "bucket_bytes and direct_bytes must be positive, got " +
          std::to_string(opts.bucket_bytes) + " and " + std::to_string(opts.direct_bytes);
  }
}

void coalesced_broadcast_checked(const std::vector<at::Tensor>& tensors, std::int64_t root,
                                 ErrorClass err, const std::string& err_text,
                                 const CoalescedOptions& opts) {
  Signature s;
  s.kind = CallKind::CoalescedBroadcast;
  s.numel = static_cast<std::int64_t>(tensors.size());
  std::string msg = err_text;
  s.error = err;
  check_root(root, s, msg);
  check_plan_options(opts.plan, s, msg);
  if (s.error == ErrorClass::None) s.error = validate(tensors, msg);
  if (s.error == ErrorClass::None) {
    // The plan depends on the options too, so ranks must agree on them as on the shapes.
    s.detail = tensors_hash(tensors, plan_options_hash(opts.plan));
    msg = std::to_string(tensors.size()) + " tensors";
  }
  agree(s, "synchronize_()", msg);
  coalesced_broadcast_data(tensors, static_cast<int>(root), opts);
}

}  // namespace fluxmpi
