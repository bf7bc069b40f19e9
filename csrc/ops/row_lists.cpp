#include "ops/row_lists.h"

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <c10/core/Allocator.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <sstream>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

#include "backend/select.h"
#include "ops/collectives.h"
#include "runtime/environment.h"
#include "runtime/group.h"
#include "runtime/hash.h"
#include "runtime/user_call.h"

namespace fluxmpi {
namespace rows {

std::int64_t row_elems(const at::Tensor& t) {
  std::int64_t n = 1;
  for (std::int64_t d = 1; d < t.dim(); ++d) n *= t.size(d);
  return n;
}

std::int64_t row_bytes(const at::Tensor& t) {
  return row_elems(t) * static_cast<std::int64_t>(c10::elementSize(t.scalar_type()));
}

namespace {

// Host outputs come from malloc, 64-byte aligned by hand, not from torch's CPU allocator.
// Its posix_memalign leaves a fragment before each block, so a loop that frees its output and
// asks for the next one gets a new address every call, cold in the caches, while malloc hands
// the freed block back: writing 2 MB into torch.empty's block took 59.7 us here against 48.9
// into numpy's (malloc's), the gap between our allgather and mpi4py's at 1 MiB per rank.
// A block of 4 MB or more also asks for transparent huge pages before its first touch, as
// numpy does: glibc maps a buffer of 32 MB or more anew on every call, and its first write
// then takes a page fault per 4 KiB (31 ms for 32 MB here against 3.7 ms with huge pages).
// Best effort: a refusal is ignored.
class HostOutputAllocator final : public c10::Allocator {
 public:
  static constexpr std::size_t kAlign = 64;  // torch's own CPU alignment

  c10::DataPtr allocate(std::size_t n) override {
    void* raw = std::malloc(n + kAlign);
    TORCH_CHECK(raw != nullptr, "fluxmpi_py: out of host memory allocating ", n,
                " bytes for a collective's output");
    const auto start = (reinterpret_cast<std::uintptr_t>(raw) + kAlign - 1) & ~(kAlign - 1);
    void* data = reinterpret_cast<void*>(start);
    advise_huge_pages(data, n);
    return {data, raw, &std::free, c10::Device(c10::DeviceType::CPU)};
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  static void advise_huge_pages(void* data, std::size_t n) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (n < (std::size_t(4) << 20)) return;
    const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
    const auto start = reinterpret_cast<std::uintptr_t>(data);
    const auto first = start & ~(page - 1);  // the page that holds the first byte
    madvise(reinterpret_cast<void*>(first), n + (start - first), MADV_HUGEPAGE);
#else
    (void)data;
    (void)n;
#endif
  }
};

HostOutputAllocator& host_output_allocator() {
  static HostOutputAllocator a;
  return a;
}

}  // namespace

at::Tensor new_output(at::IntArrayRef sizes, const at::TensorOptions& options) {
  if (options.device().type() != c10::DeviceType::CPU || options.layout() != at::kStrided ||
      options.pinned_memory()) {
    return at::empty(sizes, options);
  }
  return at::detail::empty_generic(sizes, &host_output_allocator(),
                                   c10::DispatchKeySet(c10::DispatchKey::CPU),
                                   options.dtype().toScalarType(), c10::nullopt);
}

// A new tensor like t with `rows` rows.
at::Tensor with_rows(const at::Tensor& t, std::int64_t rows) {
  auto sizes = t.sizes().vec();
  sizes[0] = rows;
  return new_output(sizes, t.options());
}

Bytes byte_buffer(const at::Tensor& like, std::int64_t n) {
  return Bytes(new_output({n}, like.options().dtype(at::kByte)));
}

// n bytes from src[soff] to dst[doff].
void copy_bytes(const Bytes& dst, std::int64_t doff, const Bytes& src, std::int64_t soff,
                std::int64_t n) {
  if (n == 0) return;
  if (dst.ptr != nullptr && src.ptr != nullptr) {
    std::memcpy(dst.ptr + doff, src.ptr + soff, static_cast<std::size_t>(n));
  } else {
    dst.flat().narrow(0, doff, n).copy_(src.flat().narrow(0, soff, n));
  }
}

// Dtypes, device types and shapes of the list (dim 0 left out where it may differ by rank),
// and the splits when they must agree: Signature::detail.
std::int64_t list_hash(const std::vector<at::Tensor>& ts, bool with_dim0, const Splits* splits) {
  std::vector<std::int64_t> v;
  v.reserve(ts.size() * 5 + (splits != nullptr ? splits->size() * 3 : 0));
  for (const auto& t : ts) {
    if (!t.defined()) {
      v.push_back(-1);
      continue;
    }
    v.push_back(static_cast<std::int64_t>(t.scalar_type()));
    v.push_back(static_cast<std::int64_t>(t.device().type()));
    v.push_back(t.dim());
    for (std::int64_t d = 0; d < t.dim(); ++d) v.push_back(d == 0 && !with_dim0 ? -1 : t.size(d));
  }
  if (splits != nullptr) {
    for (const auto& s : *splits) {
      v.push_back(-2);
      v.insert(v.end(), s.begin(), s.end());
    }
  }
  // hash_bulk: a grouped call of 1000 tensors hashes 32 KB here, ~50 us with hash_bytes
  return hash_bulk(v.data(), v.size() * sizeof(std::int64_t), static_cast<std::int64_t>(ts.size()));
}

std::string describe_list(const std::vector<at::Tensor>& ts, const Splits* splits) {
  std::ostringstream s;
  if (ts.size() == 1) {
    s << describe(ts[0]);
  } else {
    s << ts.size() << " tensors";
    for (std::size_t i = 0; i < ts.size() && s.tellp() < 300; ++i) {
      s << (i ? "; " : ": ") << "[" << i << "] " << describe(ts[i]);
    }
  }
  if (splits != nullptr) {
    for (std::size_t i = 0; i < splits->size() && s.tellp() < 420; ++i) {
      s << (i ? ", " : "; splits ") << c10::IntArrayRef((*splits)[i]);
    }
  }
  return s.str();
}

Signature list_signature(CallKind kind, const std::vector<at::Tensor>& ts, bool with_dim0,
                         const Splits* splits) {
  Signature s;
  s.kind = kind;
  s.numel = static_cast<std::int64_t>(ts.size());
  if (!ts.empty() && ts[0].defined()) s.dtype = static_cast<std::int64_t>(ts[0].scalar_type());
  s.detail = list_hash(ts, with_dim0, splits);
  return s;
}

// This rank's local error, if any: the caller's, then each tensor's (named by its index when
// there are several). `in_place`: the results go into the tensors themselves. `rows`: the call
// splits or concatenates along dim 0, so a 0-dim tensor is an error.
void validate_list(const std::vector<at::Tensor>& ts, bool in_place, bool rows,
                   const std::string& local_error, Signature& s, std::string& msg, bool bytes) {
  if (s.error != ErrorClass::None) return;
  if (!local_error.empty()) {
    s.error = ErrorClass::Type;
    msg = local_error;
    return;
  }
  for (std::size_t i = 0; i < ts.size(); ++i) {
    std::string m;
    ErrorClass c = validate_tensor(bytes ? as_pairs(ts[i]) : ts[i], m);
    // validate_tensor's only ValueError is memory overlap, which matters only for results
    // written in place; an expand()ed input is copied like any other.
    if (c == ErrorClass::Value && !in_place) c = ErrorClass::None;
    if (c == ErrorClass::None && rows && ts[i].dim() == 0) {
      c = ErrorClass::Value;
      m = "a 0-dim tensor has no rows (dim 0) to split or concatenate; pass t.reshape(1)";
    }
    if (c == ErrorClass::None && ts[i].device().type() != ts[0].device().type()) {
      c = ErrorClass::Type;
      m = "tensor is on " + ts[i].device().str() + " but tensor 0 is on " + ts[0].device().str() +
          ": one call takes tensors of one device type";
    }
    if (c != ErrorClass::None) {
      s.error = c;
      msg = ts.size() > 1 ? "tensor " + std::to_string(i) + ": " + m : m;
      return;
    }
  }
}

// Row counts per rank for each tensor: `given` checked, or equal parts. Returns the error
// text ("" when fine).
std::string resolve_splits(const Splits& given, const std::vector<at::Tensor>& ts, int world,
                           Splits& out) {
  if (!given.empty() && given.size() != ts.size()) {
    return "splits has " + std::to_string(given.size()) + " entries for " +
           std::to_string(ts.size()) + " tensors; expected one list of row counts per tensor";
  }
  out.assign(ts.size(), {});
  for (std::size_t i = 0; i < ts.size(); ++i) {
    const std::string name = ts.size() > 1 ? "tensor " + std::to_string(i) : "tensor";
    const std::int64_t rows = ts[i].size(0);
    if (given.empty() || given[i].empty()) {
      if (rows % world != 0) {
        return name + " has " + std::to_string(rows) + " rows (dim 0), which do not split into " +
               std::to_string(world) + " equal parts; pass splits= (rows per rank)";
      }
      out[i].assign(static_cast<std::size_t>(world), rows / world);
      continue;
    }
    const auto& g = given[i];
    std::int64_t sum = 0;
    bool negative = false;
    for (std::int64_t v : g) {
      sum += v;
      negative |= v < 0;
    }
    if (static_cast<int>(g.size()) != world || negative || sum != rows) {
      std::ostringstream m;
      m << "splits " << c10::IntArrayRef(g) << " for " << name << " of " << rows
        << " rows (dim 0): expected " << world << " row counts >= 0, one per rank, that sum to "
        << rows;
      return m.str();
    }
    out[i] = g;
  }
  return {};
}

// Raise on every rank when one rank's part of a call is past MPI's int counts. `bytes[r]` is
// rank r's total; every rank passes the same values.
void check_bytes(const std::vector<std::int64_t>& bytes, const char* what) {
  for (std::size_t r = 0; r < bytes.size(); ++r) {
    if (bytes[r] > kMaxBytes) {
      raise_on_every_rank(ErrorClass::Value,
                          std::string(user_call_or(what)) + ": rank " + std::to_string(r) +
                              " would move " + std::to_string(bytes[r]) +
                              " bytes in one call; the MPI backend moves at most 2 GiB - 1 per "
                              "rank and call; split the tensors over several calls");
    }
  }
}

std::int64_t sum_of(const std::vector<std::int64_t>& v) {
  std::int64_t s = 0;
  for (auto x : v) s += x;
  return s;
}

// Hash of this rank's dim 0 sizes: Signature::soft, so equal sizes everywhere skip the
// exchange of row counts.
std::int64_t rows_hash(const std::vector<at::Tensor>& ts) {
  std::vector<std::int64_t> v;
  v.reserve(ts.size());
  for (const auto& t : ts) v.push_back(t.defined() && t.dim() > 0 ? t.size(0) : -1);
  return hash_bulk(v.data(), v.size() * sizeof(std::int64_t));
}

// rows[r * k + i]: dim 0 of rank r's tensor i.
std::vector<std::int64_t> rows_of_every_rank(const std::vector<at::Tensor>& ts, bool same) {
  const int n = current_group().size();
  const std::size_t k = ts.size();
  std::vector<std::int64_t> mine(k), all(k * n);
  for (std::size_t i = 0; i < k; ++i) mine[i] = ts[i].size(0);
  if (same) {
    for (int r = 0; r < n; ++r) std::copy(mine.begin(), mine.end(), all.begin() + r * k);
  } else {
    mpi_backend().allgather(mine.data(), all.data(), static_cast<std::int64_t>(k), c10::kLong);
  }
  return all;
}

// Byte offsets of each rank's rows in tensor i: offsets[r] for splits sp.
std::vector<std::int64_t> row_offsets(const std::vector<std::int64_t>& sp, std::int64_t rb) {
  std::vector<std::int64_t> off(sp.size() + 1, 0);
  for (std::size_t r = 0; r < sp.size(); ++r) off[r + 1] = off[r] + sp[r] * rb;
  return off;
}

}  // namespace rows
}  // namespace fluxmpi
