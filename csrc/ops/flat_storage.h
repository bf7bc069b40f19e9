// Relocation, the part of synchronize_ that makes later broadcasts free of copies: CPU
// parameters move into one flat storage laid out like their packed broadcast buffer, so that
// the storage itself is the buffer.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "fusion/broadcast_plan.h"

namespace fluxmpi {

// A packed buffer needs no copy on a rank whose members already sit in one flat storage that
// fluxmpi_py made, at the buffer's offsets: that memory is the buffer. With `relocate`, a
// packed step whose members are all relocatable is broadcast through a new flat storage that
// its members then adopt (set_data: the same tensor objects, now views into it); the others
// receive straight into it, with no unpack copy. Each rank decides this from its own memory
// alone; the bytes on the wire are the same either way.
//
// Relocatable: a contiguous CPU leaf that requires grad (a parameter: numpy() cannot alias
// it) and whose storage holds exactly it, is referenced by no other tensor, and comes from
// torch's CPU allocator (not shared memory, numpy's memory, a mapped file or pinned memory).
bool relocatable(const at::Tensor& t);

// A new flat storage of `bytes` bytes (64-byte aligned), as a byte tensor, told apart from
// any other storage by its deleter.
at::Tensor new_flat(std::int64_t bytes);

// A step's home: the flat storage its relocated members live in, at `base`, the address of
// offset 0 of the step's packed layout. It is the step's buffer when every member that lives
// in it sits at its packed offset and nothing else references it (use_count equals those
// members): then the slots of the members that live elsewhere are free, and only those
// members are copied in (root) or out (others).
struct Home {
  char* base = nullptr;     // offset 0 of the step's bytes inside the home storage
  at::Tensor buf;           // those bytes as a tensor (with make_buf, unless all_live)
  std::vector<char> lives;  // per member: already at its slot, no copy
  bool all_live = false;    // every member lives at its slot: nothing to copy either way
};

// Step `s`'s home, from the probes alone (no TensorImpl is read). `buf` is made only where a
// member must be copied (make_buf and not all_live): the common call, a relocated model,
// broadcasts `base` and allocates nothing.
bool find_home(const std::vector<Probe>& probes, const BroadcastStep& s, Home& home,
               bool make_buf = true);

// Members marked in `relocating` become views into `flat` at their slots (set_data).
void adopt(const at::Tensor& flat, const std::vector<at::Tensor>& ts, const BroadcastStep& s,
           const std::vector<char>& relocating);

// Which members of step `s` may move into a new flat storage: the relocatable ones, and
// members of an earlier flat storage that only this step's members hold. That is a model whose
// parameters changed after relocation (a layer replaced, say): its remaining members move with
// the new ones, and the old storage is freed when the last of them leaves. From this call's
// probes, taken before any data moved.
std::vector<char> movable(const std::vector<at::Tensor>& ts, const BroadcastStep& s,
                          const std::vector<Probe>& probes);

// Whether this rank can take every packed CPU step of `plan` in place: each lives in its home
// already (all members at their slots, nothing else holding it), or has no home and all its
// members are movable (the call moves them). From the probes of tensors_hash, plus, only where
// there is no home, each member's movable().
bool steps_in_place(const std::vector<at::Tensor>& tensors, const std::vector<BroadcastStep>& plan,
                    const std::vector<Probe>& probes);

}  // namespace fluxmpi
