// The grouped (fused) allreduce_ and bcast_ of a list of tensors: one buffer per dtype
// (declared in ops/gather_collectives.h).
#include "ops/gather_collectives.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include <c10/core/GradMode.h>

#include "backend/select.h"
#include "ops/collectives.h"
#include "ops/consensus.h"
#include "ops/row_lists.h"
#include "runtime/environment.h"
#include "runtime/group.h"
#include "runtime/hash.h"
#include "runtime/user_call.h"

namespace fluxmpi {

using namespace rows;  // NOLINT(build/namespaces): this file's vocabulary

namespace {

bool cpu_contiguous(const at::Tensor& t) { return t.is_cpu() && t.is_contiguous(); }

// Packing buffers up to this size are kept for the next call, one per thread (the caller's
// and the engine's). A fresh 4 MB buffer cost 0.3-0.4 ms a call here (2 ranks: 2.7x one flat
// allreduce_ against 2.1x with a kept one), more than the checks of 1000 tensors.
constexpr std::int64_t kKeptBytes = std::int64_t(64) << 20;

// A flat buffer of `n` elements like `like`: a view of this thread's kept bytes when small
// enough, else a new tensor. Valid until the next call on this thread.
at::Tensor flat_buffer(const at::Tensor& like, std::int64_t n) {
  const std::int64_t bytes = n * static_cast<std::int64_t>(like.element_size());
  if (!like.is_cpu() || bytes > kKeptBytes) return at::empty({n}, like.options());
  thread_local at::Tensor kept;
  if (!kept.defined() || kept.numel() < bytes) {
    kept = at::empty({std::max<std::int64_t>(bytes, 1)}, like.options().dtype(at::kByte));
  }
  return kept.narrow(0, 0, bytes).view(like.scalar_type());
}

// Tensors idx of ts (one dtype) into one flat buffer of that dtype.
at::Tensor pack_flat(const std::vector<at::Tensor>& ts, const std::vector<std::size_t>& idx) {
  std::int64_t total = 0;
  for (auto i : idx) total += ts[i].numel();
  at::Tensor flat = flat_buffer(ts[idx[0]], total);
  const auto esz = static_cast<std::int64_t>(flat.element_size());
  std::int64_t pos = 0;
  for (auto i : idx) {
    const auto& t = ts[i];
    if (cpu_contiguous(t)) {
      std::memcpy(static_cast<char*>(flat.data_ptr()) + pos * esz, t.data_ptr(),
                  static_cast<std::size_t>(t.numel() * esz));
    } else if (t.numel() > 0) {
      flat.narrow(0, pos, t.numel()).view(t.sizes()).copy_(t);
    }
    pos += t.numel();
  }
  return flat;
}

void unpack_flat(const at::Tensor& flat, const std::vector<at::Tensor>& ts,
                 const std::vector<std::size_t>& idx) {
  const auto esz = static_cast<std::int64_t>(flat.element_size());
  std::int64_t pos = 0;
  for (auto i : idx) {
    const auto& t = ts[i];
    if (cpu_contiguous(t)) {
      std::memcpy(t.data_ptr(), static_cast<const char*>(flat.data_ptr()) + pos * esz,
                  static_cast<std::size_t>(t.numel() * esz));
      bump_version(t);
    } else if (t.numel() > 0) {
      t.copy_(flat.narrow(0, pos, t.numel()).view(t.sizes()));
    }
    pos += t.numel();
  }
}

// The tensors idx of ts (one dtype, on the CPU) reduced where they lie, as one buffer made of
// their memory, when the backend takes such a call (Backend::allreduce_pieces, from agreed
// values only: every rank answers alike). A tensor that is not contiguous, or whose memory
// overlaps one before it in address order (the same tensor twice), takes part through a
// contiguous copy that is written back: the ring needs pieces that do not overlap, and the
// result is the pack path's, whose copies would hold the same values.
bool reduce_in_place(Backend& b, const std::vector<at::Tensor>& ts,
                     const std::vector<std::size_t>& idx, ReduceOp op) {
  const auto& first = ts[idx[0]];
  if (!first.is_cpu()) return false;  // the device type is agreed: every rank returns here
  std::int64_t total = 0;
  for (auto i : idx) total += ts[i].numel();
  struct Span {
    std::uintptr_t lo, hi;
    std::size_t k, i;  // index into pieces, into ts
  };
  std::vector<BufferPiece> pieces;
  std::vector<Span> spans;
  std::vector<std::pair<std::size_t, at::Tensor>> copies;  // (index into ts, its copy)
  pieces.reserve(idx.size());
  spans.reserve(idx.size());
  const auto esz = static_cast<std::int64_t>(first.element_size());
  for (auto i : idx) {
    const auto& t = ts[i];
    if (t.numel() == 0) continue;
    if (t.is_contiguous()) {
      const auto lo = reinterpret_cast<std::uintptr_t>(t.data_ptr());
      spans.push_back({lo, lo + static_cast<std::uintptr_t>(t.numel() * esz), pieces.size(), i});
      pieces.push_back({t.data_ptr(), t.numel() * esz});
    } else {
      copies.emplace_back(i, t.contiguous());
      pieces.push_back({copies.back().second.data_ptr(), t.numel() * esz});
    }
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.lo < b.lo; });
  std::uintptr_t reach = 0;
  for (const auto& sp : spans) {
    if (sp.lo < reach) {  // overlaps an earlier piece: reduce a copy, write it back
      copies.emplace_back(sp.i, ts[sp.i].clone());
      pieces[sp.k].ptr = copies.back().second.data_ptr();
    }
    reach = std::max(reach, sp.hi);
  }
  if (!b.allreduce_pieces(pieces, total, first.scalar_type(), op)) return false;
  for (auto i : idx) {
    if (ts[i].numel() > 0 && ts[i].is_contiguous()) bump_version(ts[i]);
  }
  for (const auto& [i, c] : copies) ts[i].copy_(c);
  return true;
}

}  // namespace

void grouped_allreduce_zeros(Backend& b, const at::Tensor& zeros, ReduceOp op, int world) {
  // What the active ranks' list of this dtype does, below: reduced where it lies when the
  // backend takes it (it decides from the count, dtype and op alone), else packed into one
  // buffer of the same count.
  const std::vector<BufferPiece> one{{zeros.data_ptr(), zeros.numel() * zeros.element_size()}};
  if (zeros.is_cpu() && zeros.numel() > 0 &&
      b.allreduce_pieces(one, zeros.numel(), zeros.scalar_type(), op)) {
    return;
  }
  allreduce_data(b, zeros, op, world);
}

namespace {

// Indices of ts grouped by dtype, groups in the order of first appearance.
std::vector<std::vector<std::size_t>> by_dtype(const std::vector<at::Tensor>& ts) {
  std::vector<std::vector<std::size_t>> groups;
  std::vector<c10::ScalarType> seen;
  for (std::size_t i = 0; i < ts.size(); ++i) {
    std::size_t g = 0;
    while (g < seen.size() && seen[g] != ts[i].scalar_type()) ++g;
    if (g == seen.size()) {
      seen.push_back(ts[i].scalar_type());
      groups.emplace_back();
    }
    groups[g].push_back(i);
  }
  return groups;
}

}  // namespace

void grouped_allreduce_checked(const std::vector<at::Tensor>& given, const std::string& opname,
                               const std::string& local_error) {
  const Group& e = current_group();
  // The signature is of the tensors given, so a complex tensor and its pairs as reals disagree.
  Signature s = list_signature(CallKind::GroupedAllreduce, given, /*with_dim0=*/true, nullptr);
  std::string msg;
  ReduceOp op = parse_op_into(opname, s, msg);
  // What moves: complex tensors as pairs of reals in a sum or an average (views: the results
  // land in the tensors given); other ops keep them, and check_op_dtype refuses them.
  std::vector<at::Tensor> ts;
  ts.reserve(given.size());
  const bool pairs = op == ReduceOp::Sum || op == ReduceOp::Average;
  for (const auto& t : given) ts.push_back(pairs ? as_pairs(t) : t);
  validate_list(ts, /*in_place=*/true, /*rows=*/false, local_error, s, msg);
  for (const auto& t : ts) check_op_dtype(op, t, s, msg);
  s.joinable = Joinable::Allreduce;
  bool joined = false;
  agree(
      s, "grouped_allreduce_()", msg, [&] { return describe_list(given, nullptr); }, nullptr,
      &joined);
  const auto groups = by_dtype(ts);
  if (joined) {  // one backend allreduce per dtype, below
    AllreduceParts p;
    if (!ts.empty()) p.device = ts[0].device().type();
    for (const auto& idx : groups) {
      std::int64_t n = 0;
      for (auto i : idx) n += ts[i].numel();
      p.parts.push_back({ts[idx[0]].scalar_type(), n, /*list=*/idx.size() > 1});
    }
    share_with_joined(p, /*is_joined=*/false);
  }
  if (ts.empty()) return;
  c10::AutoGradMode no_grad(false);
  if (e.size() == 1) {  // every op of one value is that value: no pack, no copies
    for (const auto& t : ts) {
      if (t.numel() > 0) bump_version(t);
    }
    return;
  }
  Backend& b = backend_for(ts[0]);
  for (const auto& idx : groups) {
    if (idx.size() == 1) {
      allreduce_data(b, ts[idx[0]], op, e.size());
      continue;
    }
    if (reduce_in_place(b, ts, idx, op)) continue;
    at::Tensor flat = pack_flat(ts, idx);
    allreduce_data(b, flat, op, e.size());
    unpack_flat(flat, ts, idx);
  }
}

void grouped_broadcast_checked(const std::vector<at::Tensor>& ts, std::int64_t root,
                               const std::string& local_error) {
  const Group& e = current_group();
  Signature s = list_signature(CallKind::GroupedBroadcast, ts, /*with_dim0=*/true, nullptr);
  std::string msg;
  validate_list(ts, /*in_place=*/true, /*rows=*/false, local_error, s, msg, /*bytes=*/true);
  check_root(root, s, msg);
  agree(s, "grouped_bcast_()", msg, [&] { return describe_list(ts, nullptr); });
  if (ts.empty()) return;
  c10::AutoGradMode no_grad(false);
  Backend& b = backend_for(ts[0]);
  if (ts.size() == 1) {
    broadcast_data(b, as_pairs(ts[0]), static_cast<int>(root));
    return;
  }
  // Every dtype as bytes, in one buffer.
  std::int64_t total = 0;
  for (const auto& t : ts) total += t.numel() * static_cast<std::int64_t>(t.element_size());
  Bytes buf = byte_buffer(ts[0], total);
  const bool is_root = e.rank() == root;
  std::int64_t pos = 0;
  if (is_root) {
    for (const auto& t : ts) {
      Bytes src(t);
      copy_bytes(buf, pos, src, 0, src.n);
      pos += src.n;
    }
  }
  if (total == 0) return;
  b.broadcast(buf.data(), total, at::kByte, static_cast<int>(root));
  if (is_root) return;
  pos = 0;
  for (const auto& t : ts) {
    const std::int64_t nb = t.numel() * static_cast<std::int64_t>(t.element_size());
    if (nb > 0) {
      if (cpu_contiguous(t)) {
        std::memcpy(t.data_ptr(), buf.ptr + pos, static_cast<std::size_t>(nb));
        bump_version(t);
      } else {
        // a copy: the bytes at `pos` need not be aligned for t's dtype
        t.copy_(buf.flat().narrow(0, pos, nb).clone().view(t.scalar_type()).view(t.sizes()));
      }
    }
    pos += nb;
  }
}

}  // namespace fluxmpi
