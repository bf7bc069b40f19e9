#include "ops/coalesced_broadcast.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <map>
#include <sstream>

#include "backend/select.h"
#include "ops/collectives.h"
#include "runtime/environment.h"

namespace fluxmpi {

namespace {

std::atomic<std::int64_t> g_copied{0};    // bytes copied into or out of packed buffers
std::atomic<std::int64_t> g_in_place{0};  // bytes of packed buffers broadcast in place

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

// Copy the members of step `s` that do not already live at their slot of the packed buffer
// `buf` (a byte tensor) into it (`into`, the root) or out of it (the others). `lives` may be
// empty: then every member is copied. A member that lives at its slot is not read at all.
void copy_slots(const at::Tensor& buf, const std::vector<at::Tensor>& ts, const BroadcastStep& s,
                const std::vector<char>& lives, bool into, const std::vector<Probe>& probes) {
  auto* base = static_cast<char*>(buf.data_ptr());
  std::int64_t off = 0;
  for (std::size_t k = 0; k < s.members.size(); ++k) {
    const std::int64_t n = probes[s.members[k]].nbytes;
    if (lives.empty() || !lives[k]) {
      const auto& t = ts[s.members[k]];
      g_copied += n;
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

// How many holders a storage has: tensors, and Python storage objects that someone holds. A
// storage's Python wrapper (made by untyped_storage(), torch.save, ...) holds a reference and
// is kept alive by the storage while tensors use it; when nothing else refers to that wrapper,
// it is not a holder. (Read without the GIL: a race could only miscount a wrapper that is
// being created or dropped at that moment, by another thread.)
std::size_t holders(c10::StorageImpl* s) {
  std::size_t n = c10::raw::intrusive_ptr::use_count(s);
  if (n > 1 && s->pyobj_slot()->has_unique_reference()) --n;
  return n;
}

// Flat storage made by relocation, told apart from any other storage by its deleter.
void free_flat(void* p) { std::free(p); }

bool is_flat(const c10::StorageImpl* st) { return st->data_ptr().get_deleter() == &free_flat; }

at::Tensor new_flat(std::int64_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, kAlign, static_cast<std::size_t>(std::max<std::int64_t>(bytes, 1))) != 0) {
    throw std::bad_alloc();
  }
  c10::Storage st(c10::Storage::use_byte_size_t(), bytes,
                  c10::DataPtr(p, p, &free_flat, c10::Device(c10::kCPU)), nullptr, false);
  return at::empty({0}, at::TensorOptions().dtype(at::kByte)).set_(st, 0, {bytes}, {1});
}

// Memory from torch's CPU allocator, which nothing outside this process can see. Not our flat
// storage (already relocated), shared memory (share_memory_(): other processes read it),
// numpy's memory (from_numpy), a memory-mapped file or pinned memory: those stay put.
bool from_cpu_allocator(const c10::Storage& st) {
  auto deleter = st.data_ptr().get_deleter();
  if (deleter == nullptr) return false;
  auto* current = c10::GetCPUAllocator();
  auto* fallback = c10::GetDefaultCPUAllocator();
  return deleter == current->raw_deleter() || deleter == fallback->raw_deleter();
}

// A step's home: the flat storage its relocated members live in, at `base`, the address of
// offset 0 of the step's packed layout. It is the step's buffer when every member that lives
// in it sits at its packed offset and nothing else references it (use_count equals those
// members): then the slots of the members that live elsewhere are free, and only those
// members are copied in (root) or out (others).
struct Home {
  at::Tensor buf;           // the step's bytes inside the home storage
  std::vector<char> lives;  // per member: already at its slot, no copy
};

// From the probes alone: no TensorImpl is read.
bool find_home(const std::vector<Probe>& probes, const BroadcastStep& s, Home& home,
               bool make_buf = true) {
  const c10::StorageImpl* h = nullptr;
  const char* base = nullptr;
  std::int64_t off = 0;
  std::size_t in_home = 0;
  home.lives.assign(s.members.size(), 0);
  for (std::size_t k = 0; k < s.members.size(); ++k) {
    const Probe& p = probes[s.members[k]];
    if (p.storage != nullptr) {
      if (h == nullptr && is_flat(p.storage)) {
        h = p.storage;
        base = p.data - off;
      }
      if (h != nullptr && p.storage == h) {
        if (p.data != base + off) return false;
        home.lives[k] = 1;
        ++in_home;
      }
    }
    off += align_up(p.nbytes);
  }
  if (h == nullptr) return false;
  auto* begin = static_cast<const char*>(h->data());
  if (base < begin || base + s.bytes > begin + h->nbytes()) return false;
  if (holders(const_cast<c10::StorageImpl*>(h)) != in_home) {
    return false;
  }
  if (!make_buf) return true;
  // Written in place: the home is ours (its holders are exactly this step's members).
  home.buf = at::from_blob(const_cast<char*>(base), {s.bytes},
                           at::TensorOptions().dtype(at::kByte));
  return true;
}

// Members that are relocatable become views into `flat` at their slots.
void adopt(const at::Tensor& flat, const std::vector<at::Tensor>& ts, const BroadcastStep& s,
           const std::vector<char>& relocating) {
  const c10::Storage& st = flat.storage();
  std::int64_t off = 0;
  for (std::size_t k = 0; k < s.members.size(); ++k) {
    const auto& t = ts[s.members[k]];
    if (relocating[k]) {
      auto view = at::empty({0}, at::TensorOptions().dtype(t.scalar_type()).device(t.device()));
      view.set_(st, off / static_cast<std::int64_t>(t.element_size()), t.sizes(), t.strides());
      t.set_data(view);
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

CopyCounters copy_counters() { return {g_copied.load(), g_in_place.load()}; }

bool relocatable(const at::Tensor& t) {
  if (!t.defined() || !t.is_cpu() || t.layout() != c10::kStrided || !t.is_contiguous() ||
      !t.is_leaf() || !t.requires_grad() || !t.has_storage() || t.storage_offset() != 0) {
    return false;
  }
  const c10::Storage& st = t.storage();
  return holders(st.unsafeGetStorageImpl()) == 1 &&
         static_cast<std::int64_t>(st.nbytes()) == nbytes_of(t) && from_cpu_allocator(st);
}

namespace {

// Which members of step `s` may move into a new flat storage: the relocatable ones, and
// members of an earlier flat storage that only this step's members hold. That is a model whose
// parameters changed after relocation (a layer replaced, say): its remaining members move with
// the new ones, and the old storage is freed when the last of them leaves. From this call's
// probes, taken before any data moved.
std::vector<char> movable(const std::vector<at::Tensor>& ts, const BroadcastStep& s,
                          const std::vector<Probe>& probes) {
  std::vector<char> out(s.members.size(), 0);
  std::map<const c10::StorageImpl*, std::size_t> in_flat;  // this step's members per old flat
  for (auto m : s.members) {
    const Probe& p = probes[m];
    if (p.storage != nullptr && is_flat(p.storage)) ++in_flat[p.storage];
  }
  for (std::size_t k = 0; k < s.members.size(); ++k) {
    const auto& t = ts[s.members[k]];
    const Probe& p = probes[s.members[k]];
    if (relocatable(t)) {
      out[k] = 1;
    } else if (p.storage != nullptr && is_flat(p.storage) && t.is_leaf() && t.requires_grad()) {
      out[k] = holders(const_cast<c10::StorageImpl*>(p.storage)) == in_flat[p.storage] ? 1 : 0;
    }
  }
  return out;
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
    bool large = n >= opts.direct_bytes && !(opts.pack_cpu && dev == c10::DeviceType::CPU);
    if (large || align_up(n) > opts.bucket_bytes) {
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

bool steps_in_place(const std::vector<at::Tensor>& tensors, const std::vector<BroadcastStep>& plan,
                    const std::vector<Probe>& probes) {
  for (const auto& s : plan) {
    if (s.direct || s.device != c10::DeviceType::CPU) continue;
    Home home;
    if (find_home(probes, s, home, false)) {
      if (std::find(home.lives.begin(), home.lives.end(), 0) == home.lives.end()) continue;
      return false;
    }
    auto can = movable(tensors, s, probes);
    if (std::find(can.begin(), can.end(), 0) != can.end()) return false;
  }
  return true;
}

std::int64_t tensors_hash(const std::vector<at::Tensor>& tensors, std::int64_t seed,
                          std::vector<Probe>* probes) {
  // Word by word (hash_bytes goes byte by byte: ~35 us for a thousand tensors' shapes).
  std::uint64_t h = static_cast<std::uint64_t>(hash_bytes(nullptr, 0, seed));
  auto mix = [&h](std::uint64_t w) {
    h ^= w + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdull;
  };
  // Each TensorImpl (176 bytes, 3 or 4 cache lines) is read from memory when the model is
  // cold in cache (a thousand of them took ~40 us); fetching a few ahead overlaps the misses.
  constexpr std::size_t kAhead = 8;
  auto prefetch = [&](std::size_t i) {
    if (i < tensors.size() && tensors[i].defined()) {
      const char* p = reinterpret_cast<const char*>(tensors[i].unsafeGetTensorImpl());
      constexpr std::size_t last = sizeof(c10::TensorImpl) - 1;
      __builtin_prefetch(p);
      __builtin_prefetch(p + 64);
      __builtin_prefetch(p + 128);
      __builtin_prefetch(p + last);
    }
  };
  if (probes != nullptr) probes->assign(tensors.size(), Probe{});
  for (std::size_t i = 0; i < kAhead; ++i) prefetch(i);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    prefetch(i + kAhead);
    const auto& t = tensors[i];
    if (!t.defined()) {
      mix(~std::uint64_t(0));
      continue;
    }
    mix(static_cast<std::uint64_t>(t.dim()));
    for (auto d : t.sizes()) mix(static_cast<std::uint64_t>(d));
    mix(static_cast<std::uint64_t>(t.scalar_type()) << 8 |
        static_cast<std::uint64_t>(t.device().type()));
    if (probes != nullptr) {
      Probe& p = (*probes)[i];
      p.nbytes = nbytes_of(t);
      const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
      if (impl->is_cpu() && impl->has_storage() && impl->is_contiguous()) {
        const c10::StorageImpl* st = impl->unsafe_storage().unsafeGetStorageImpl();
        p.storage = st;
        p.data = static_cast<const char*>(st->data()) + impl->storage_offset() * impl->itemsize();
      }
    }
  }
  return static_cast<std::int64_t>(h >> 1);
}

void coalesced_broadcast_data(const std::vector<at::Tensor>& tensors, int root,
                              const CoalescedOptions& opts,
                              const std::vector<BroadcastStep>* plan,
                              const std::vector<Probe>* probes) {
  // Parameters are leaves that require grad; writing the root's values is not a step of
  // any autograd graph, so any copy below runs without autograd.
  c10::AutoGradMode no_grad(false);
  const auto& e = env();
  if (e.size == 1) return;
  bool is_root = e.rank == root;
  std::vector<BroadcastStep> own;
  if (plan == nullptr) {
    own = plan_broadcast(tensors, opts);
    plan = &own;
  }
  const auto& steps = *plan;
  std::vector<Probe> own_probes;
  if (probes == nullptr) {
    tensors_hash(tensors, 0, &own_probes);
    probes = &own_probes;
  }
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
    if (s.device == c10::DeviceType::CPU) {
      Home home;
      if (find_home(*probes, s, home)) {  // the broadcast reads and writes it in place
        if (is_root) copy_slots(home.buf, tensors, s, home.lives, true, *probes);
        g_in_place += s.bytes;
        b.broadcast(home.buf.data_ptr(), s.bytes, at::kByte, root);
        if (!is_root) copy_slots(home.buf, tensors, s, home.lives, false, *probes);
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
        if (is_root) {
          // Every slot is filled below; the padding after each travels too: zeros, not what
          // the allocator left (zeroing only the padding: a whole 64 MiB step took ~10 ms).
          auto* base = static_cast<char*>(flat.data_ptr());
          std::int64_t off = 0;
          for (auto m : s.members) {
            const std::int64_t n = (*probes)[m].nbytes;
            std::memset(base + off + n, 0, static_cast<std::size_t>(align_up(n) - n));
            off += align_up(n);
          }
          copy_slots(flat, tensors, s, {}, true, *probes);
        }
        b.broadcast(flat.data_ptr(), s.bytes, at::kByte, root);
        if (!is_root) copy_slots(flat, tensors, s, relocating, false, *probes);
        adopt(flat, tensors, s, relocating);
        continue;
      }
    }
    const auto& buf = staging[s.device];
    if (is_root) copy_slots(buf, tensors, s, {}, true, *probes);
    b.broadcast(buf.data_ptr(), s.bytes, at::kByte, root);
    if (!is_root) copy_slots(buf, tensors, s, {}, false, *probes);
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
