// Relocation: parameters moved into flat storage laid out like their packed broadcast buffer
// (ops/flat_storage.h).
#include "ops/flat_storage.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <new>

namespace fluxmpi {

namespace {

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

}  // namespace

at::Tensor new_flat(std::int64_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, kAlign, static_cast<std::size_t>(std::max<std::int64_t>(bytes, 1))) != 0) {
    throw std::bad_alloc();
  }
  c10::Storage st(c10::Storage::use_byte_size_t(), bytes,
                  c10::DataPtr(p, p, &free_flat, c10::Device(c10::kCPU)), nullptr, false);
  return at::empty({0}, at::TensorOptions().dtype(at::kByte)).set_(st, 0, {bytes}, {1});
}

bool find_home(const std::vector<Probe>& probes, const BroadcastStep& s, Home& home,
               bool make_buf) {
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
  // Written in place: the home is ours (its holders are exactly this step's members).
  home.base = const_cast<char*>(base);
  home.all_live = in_home == s.members.size();
  if (make_buf && !home.all_live) {
    home.buf = at::from_blob(home.base, {s.bytes}, at::TensorOptions().dtype(at::kByte));
  }
  return true;
}

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

bool relocatable(const at::Tensor& t) {
  if (!t.defined() || !t.is_cpu() || t.layout() != c10::kStrided || !t.is_contiguous() ||
      !t.is_leaf() || !t.requires_grad() || !t.has_storage() || t.storage_offset() != 0) {
    return false;
  }
  const c10::Storage& st = t.storage();
  return holders(st.unsafeGetStorageImpl()) == 1 &&
         static_cast<std::int64_t>(st.nbytes()) == nbytes_of(t) && from_cpu_allocator(st);
}

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

bool steps_in_place(const std::vector<at::Tensor>& tensors, const std::vector<BroadcastStep>& plan,
                    const std::vector<Probe>& probes) {
  for (const auto& s : plan) {
    if (s.direct || s.device != c10::DeviceType::CPU) continue;
    Home home;
    if (find_home(probes, s, home, false)) {
      if (home.all_live) continue;
      return false;
    }
    auto can = movable(tensors, s, probes);
    if (std::find(can.begin(), can.end(), 0) != can.end()) return false;
  }
  return true;
}

}  // namespace fluxmpi
