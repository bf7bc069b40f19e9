#include "ops/coalesced_broadcast.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <sstream>

#include "backend/select.h"
#include "ops/collectives.h"
#include "runtime/environment.h"

namespace fluxmpi {

namespace {

// Offsets inside a packed buffer are aligned so that a slice can be viewed as any dtype.
constexpr std::int64_t kAlign = 64;

std::int64_t align_up(std::int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

std::int64_t nbytes_of(const at::Tensor& t) {
  return t.numel() * static_cast<std::int64_t>(t.element_size());
}

// The slice of `buf` at `offset` seen as a tensor shaped like `t`.
at::Tensor slice_like(const at::Tensor& buf, std::int64_t offset, const at::Tensor& t) {
  return buf.narrow(0, offset, nbytes_of(t)).view(t.scalar_type()).view(t.sizes());
}

// Host tensors in a contiguous layout are copied with memcpy: at::copy_ costs microseconds
// of dispatch per tensor, which for a thousand small tensors is more than the copy itself.
bool plain_host(const at::Tensor& t) { return t.is_cpu() && t.is_contiguous(); }

void pack(const at::Tensor& buf, const std::vector<at::Tensor>& ts, const BroadcastStep& s) {
  auto* base = static_cast<char*>(buf.data_ptr());
  std::int64_t off = 0;
  for (auto i : s.members) {
    const auto& t = ts[i];
    if (plain_host(t) && buf.is_cpu()) {
      std::memcpy(base + off, t.data_ptr(), nbytes_of(t));
    } else {
      slice_like(buf, off, t).copy_(t);
    }
    off += align_up(nbytes_of(t));
  }
}

void unpack(const at::Tensor& buf, const std::vector<at::Tensor>& ts, const BroadcastStep& s) {
  const auto* base = static_cast<const char*>(buf.data_ptr());
  std::int64_t off = 0;
  for (auto i : s.members) {
    const auto& t = ts[i];
    if (plain_host(t) && buf.is_cpu()) {
      std::memcpy(t.data_ptr(), base + off, nbytes_of(t));
    } else {
      t.copy_(slice_like(buf, off, t));
    }
    off += align_up(nbytes_of(t));
  }
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
  }
  return ErrorClass::None;
}

}  // namespace

std::vector<BroadcastStep> plan_broadcast(const std::vector<at::Tensor>& tensors,
                                          const CoalescedOptions& opts) {
  std::vector<BroadcastStep> steps;
  std::map<c10::DeviceType, std::size_t> open;  // the bucket still filling, per device type
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    std::int64_t n = nbytes_of(t);
    if (n == 0) continue;
    auto dev = t.device().type();
    if (n >= opts.direct_bytes || align_up(n) > opts.bucket_bytes) {
      steps.push_back({true, dev, {i}, n});
      continue;
    }
    auto it = open.find(dev);
    if (it == open.end() || steps[it->second].bytes + align_up(n) > opts.bucket_bytes) {
      steps.push_back({false, dev, {}, 0});
      it = open.insert_or_assign(dev, steps.size() - 1).first;
    }
    auto& s = steps[it->second];
    s.members.push_back(i);
    s.bytes += align_up(n);
  }
  return steps;
}

std::int64_t tensors_hash(const std::vector<at::Tensor>& tensors, std::int64_t seed) {
  std::int64_t h = hash_bytes(nullptr, 0, seed);
  std::vector<std::int64_t> v;
  for (const auto& t : tensors) {
    v.clear();
    if (t.defined()) {
      v.push_back(t.dim());
      v.insert(v.end(), t.sizes().begin(), t.sizes().end());
      v.push_back(static_cast<std::int64_t>(t.scalar_type()));
      v.push_back(static_cast<std::int64_t>(t.device().type()));
    } else {
      v.push_back(-1);
    }
    h = hash_bytes(v.data(), v.size() * sizeof(std::int64_t), h);
  }
  return h;
}

void coalesced_broadcast_data(const std::vector<at::Tensor>& tensors, int root,
                              const CoalescedOptions& opts) {
  // Parameters are leaves that require grad; writing the root's values is not a step of
  // any autograd graph, so any copy below runs without autograd.
  c10::AutoGradMode no_grad(false);
  const auto& e = env();
  if (e.size == 1) return;
  bool is_root = e.rank == root;
  auto steps = plan_broadcast(tensors, opts);
  // One staging buffer per device type, as large as its largest bucket, reused by all.
  std::map<c10::DeviceType, std::int64_t> need;
  for (const auto& s : steps) {
    if (!s.direct) need[s.device] = std::max(need[s.device], s.bytes);
  }
  std::map<c10::DeviceType, at::Tensor> staging;
  for (const auto& s : steps) {
    if (s.direct || staging.count(s.device)) continue;
    std::int64_t bytes = need[s.device];
    staging[s.device] =
        s.device == c10::DeviceType::CPU
            ? host_staging(bytes)
            : at::empty({bytes}, tensors[s.members[0]].options().dtype(at::kByte));
  }
  for (const auto& s : steps) {
    const auto& first = tensors[s.members[0]];
    Backend& b = backend_for(first);
    if (s.direct) {
      broadcast_data(b, first, root);
      continue;
    }
    const auto& buf = staging[s.device];
    if (is_root) pack(buf, tensors, s);
    b.broadcast(buf.data_ptr(), s.bytes, at::kByte, root);
    if (!is_root) unpack(buf, tensors, s);
  }
}

void coalesced_broadcast_checked(const std::vector<at::Tensor>& tensors, std::int64_t root,
                                 ErrorClass err, const std::string& err_text,
                                 const CoalescedOptions& opts) {
  const auto& e = env();
  Signature s;
  s.kind = CallKind::CoalescedBroadcast;
  s.root = root;
  s.numel = static_cast<std::int64_t>(tensors.size());
  std::string msg = err_text;
  s.error = err;
  if (s.error == ErrorClass::None && (root < 0 || root >= e.size)) {
    s.error = ErrorClass::Value;
    msg = "root_rank " + std::to_string(root) + " is out of range; expected 0 <= root_rank < " +
          std::to_string(e.size);
  }
  if (s.error == ErrorClass::None && (opts.bucket_bytes <= 0 || opts.direct_bytes <= 0)) {
    s.error = ErrorClass::Value;
    msg = "bucket_bytes and direct_bytes must be positive, got " +
          std::to_string(opts.bucket_bytes) + " and " + std::to_string(opts.direct_bytes);
  }
  if (s.error == ErrorClass::None) s.error = validate(tensors, msg);
  if (s.error == ErrorClass::None) {
    // The plan depends on the options too, so ranks must agree on them as on the shapes.
    std::int64_t o[2] = {opts.bucket_bytes, opts.direct_bytes};
    s.detail = tensors_hash(tensors, hash_bytes(o, sizeof(o)));
    msg = std::to_string(tensors.size()) + " tensors";
  }
  agree(s, "fluxmpi_py.synchronize_", msg);
  coalesced_broadcast_data(tensors, static_cast<int>(root), opts);
}

}  // namespace fluxmpi
