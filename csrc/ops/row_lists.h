// What the row collectives (ops/gather_collectives.h) share: the checks of a list of tensors
// and its splits, the agreement signature of a list, and byte-level copies into one buffer.
// Every rank runs the same checks on the same agreed values, so their verdicts agree.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ops/consensus.h"
#include "ops/splits.h"

namespace fluxmpi {
namespace rows {

// MPI counts and offsets are ints; checked on every rank alike, from counts every rank knows.
constexpr std::int64_t kMaxBytes = 2147483647;

std::int64_t row_elems(const at::Tensor& t);
std::int64_t row_bytes(const at::Tensor& t);

// A tensor's bytes, flat and contiguous. On the CPU also a raw pointer, so that packing a
// grouped call of thousands of tensors makes no dispatcher call per tensor.
struct Bytes {
  at::Tensor t;  // contiguous, owns the bytes
  char* ptr = nullptr;
  std::int64_t n = 0;
  Bytes() = default;
  explicit Bytes(const at::Tensor& x)
      : t(x.is_contiguous() ? x : x.contiguous()),
        n(x.numel() * static_cast<std::int64_t>(x.element_size())) {
    if (t.is_cpu()) ptr = static_cast<char*>(t.data_ptr());
  }
  void* data() const { return t.data_ptr(); }
  at::Tensor flat() const { return t.view({-1}).view(at::kByte); }
};

// A new uninitialized tensor for a collective's result. On the CPU its block comes from
// malloc, so a loop that frees each result gets the same warm block back (see row_lists.cpp).
at::Tensor new_output(at::IntArrayRef sizes, const at::TensorOptions& options);
// A new tensor like t with `rows` rows.
at::Tensor with_rows(const at::Tensor& t, std::int64_t rows);
Bytes byte_buffer(const at::Tensor& like, std::int64_t n);
// n bytes from src[soff] to dst[doff].
void copy_bytes(const Bytes& dst, std::int64_t doff, const Bytes& src, std::int64_t soff,
                std::int64_t n);
// Dtypes, device types and shapes of the list (dim 0 left out where it may differ by rank),
// and the splits when they must agree: Signature::detail.
std::int64_t list_hash(const std::vector<at::Tensor>& ts, bool with_dim0, const Splits* splits);
std::string describe_list(const std::vector<at::Tensor>& ts, const Splits* splits);
Signature list_signature(CallKind kind, const std::vector<at::Tensor>& ts, bool with_dim0,
                         const Splits* splits);
// This rank's local error, if any: the caller's, then each tensor's (named by its index when
// there are several). `in_place`: the results go into the tensors themselves. `rows`: the call
// splits or concatenates along dim 0, so a 0-dim tensor is an error. `bytes`: the call only
// moves bytes (no arithmetic), so complex tensors are fine too.
void validate_list(const std::vector<at::Tensor>& ts, bool in_place, bool rows,
                   const std::string& local_error, Signature& s, std::string& msg,
                   bool bytes = false);
// Row counts per rank for each tensor: `given` checked, or equal parts. Returns the error
// text ("" when fine).
std::string resolve_splits(const Splits& given, const std::vector<at::Tensor>& ts, int world,
                           Splits& out);
// Raise on every rank when one rank's part of a call is past MPI's int counts. `bytes[r]` is
// rank r's total; every rank passes the same values.
void check_bytes(const std::vector<std::int64_t>& bytes, const char* what);
std::int64_t sum_of(const std::vector<std::int64_t>& v);
// Hash of this rank's dim 0 sizes: Signature::soft, so equal sizes everywhere skip the
// exchange of row counts.
std::int64_t rows_hash(const std::vector<at::Tensor>& ts);
// rows[r * k + i]: dim 0 of rank r's tensor i (an allgather unless `same`).
std::vector<std::int64_t> rows_of_every_rank(const std::vector<at::Tensor>& ts, bool same);
// Byte offsets of each rank's rows in tensor i: offsets[r] for splits sp.
std::vector<std::int64_t> row_offsets(const std::vector<std::int64_t>& sp, std::int64_t rb);

}  // namespace rows
}  // namespace fluxmpi
