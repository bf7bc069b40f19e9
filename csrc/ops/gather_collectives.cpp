#include "ops/gather_collectives.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cstring>
#include <limits>
#include <sstream>

#include "backend/select.h"
#include "ops/collectives.h"
#include "ops/consensus.h"
#include "runtime/environment.h"
#include "runtime/hash.h"
#include "runtime/user_call.h"

namespace fluxmpi {

namespace {

// MPI counts and offsets are ints; checked on every rank alike, from counts every rank knows.
constexpr std::int64_t kMaxBytes = std::numeric_limits<int>::max();

std::int64_t row_elems(const at::Tensor& t) {
  std::int64_t n = 1;
  for (std::int64_t d = 1; d < t.dim(); ++d) n *= t.size(d);
  return n;
}

std::int64_t row_bytes(const at::Tensor& t) {
  return row_elems(t) * static_cast<std::int64_t>(c10::elementSize(t.scalar_type()));
}

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

// A new tensor like t with `rows` rows.
at::Tensor with_rows(const at::Tensor& t, std::int64_t rows) {
  auto sizes = t.sizes().vec();
  sizes[0] = rows;
  return at::empty(sizes, t.options());
}

Bytes byte_buffer(const at::Tensor& like, std::int64_t n) {
  return Bytes(at::empty({n}, like.options().dtype(at::kByte)));
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
  return hash_bytes(v.data(), v.size() * sizeof(std::int64_t),
                    static_cast<std::int64_t>(ts.size()));
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
                   const std::string& local_error, Signature& s, std::string& msg) {
  if (s.error != ErrorClass::None) return;
  if (!local_error.empty()) {
    s.error = ErrorClass::Type;
    msg = local_error;
    return;
  }
  for (std::size_t i = 0; i < ts.size(); ++i) {
    std::string m;
    ErrorClass c = validate_tensor(ts[i], m);
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
  for (const auto& t : ts) v.push_back(t.defined() && t.dim() > 0 ? t.size(0) : -1);
  return hash_bytes(v.data(), v.size() * sizeof(std::int64_t));
}

// rows[r * k + i]: dim 0 of rank r's tensor i.
std::vector<std::int64_t> rows_of_every_rank(const std::vector<at::Tensor>& ts, bool same) {
  const int n = env().size;
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

std::vector<at::Tensor> gather_rows(const std::vector<at::Tensor>& ts, std::int64_t root,
                                    const std::string& local_error, Splits* rows_out) {
  const auto& e = env();
  const bool all = root < 0;
  const char* what = all ? "allgather()" : "gather()";
  Signature s =
      list_signature(all ? CallKind::Allgather : CallKind::Gather, ts, /*with_dim0=*/false, {});
  std::string msg;
  validate_list(ts, /*in_place=*/false, /*rows=*/true, local_error, s, msg);
  if (!all) check_root(root, s, msg);
  if (s.error == ErrorClass::None) s.soft = rows_hash(ts);
  const bool same = agree(s, what, msg, [&] { return describe_list(ts, nullptr); });
  if (ts.empty()) return {};
  const int n = e.size;
  const std::size_t k = ts.size();
  const auto rows = rows_of_every_rank(ts, same);
  if (rows_out != nullptr) {
    rows_out->assign(k, std::vector<std::int64_t>(n));
    for (int r = 0; r < n; ++r) {
      for (std::size_t i = 0; i < k; ++i) (*rows_out)[i][r] = rows[r * k + i];
    }
  }
  std::vector<std::int64_t> part(n, 0);
  for (int r = 0; r < n; ++r) {
    for (std::size_t i = 0; i < k; ++i) part[r] += rows[r * k + i] * row_bytes(ts[i]);
  }
  check_bytes({sum_of(part)}, what);
  const bool receives = all || e.rank == root;
  c10::AutoGradMode no_grad(false);
  std::vector<at::Tensor> out;
  if (receives) {
    for (std::size_t i = 0; i < k; ++i) {
      std::int64_t total = 0;
      for (int r = 0; r < n; ++r) total += rows[r * k + i];
      out.push_back(with_rows(ts[i], total));
    }
  }
  Bytes send;
  if (k == 1) {
    send = Bytes(ts[0]);
  } else {
    send = byte_buffer(ts[0], part[e.rank]);
    std::int64_t pos = 0;
    for (const auto& t : ts) {
      Bytes b(t);
      copy_bytes(send, pos, b, 0, b.n);
      pos += b.n;
    }
  }
  Bytes recv;
  if (receives) recv = k == 1 ? Bytes(out[0]) : byte_buffer(ts[0], sum_of(part));
  Backend& b = backend_for(ts[0]);
  void* recv_ptr = receives ? recv.data() : nullptr;
  if (all) {
    b.allgatherv(send.data(), part[e.rank], recv_ptr, part);
  } else {
    b.gatherv(send.data(), part[e.rank], recv_ptr, part, static_cast<int>(root));
  }
  if (!receives) return {};
  if (k > 1) {
    std::vector<std::int64_t> filled(k, 0);  // bytes written into each output
    std::vector<Bytes> dst;
    for (const auto& o : out) dst.emplace_back(o);
    std::int64_t pos = 0;
    for (int r = 0; r < n; ++r) {
      for (std::size_t i = 0; i < k; ++i) {
        const std::int64_t nb = rows[r * k + i] * row_bytes(ts[i]);
        copy_bytes(dst[i], filled[i], recv, pos, nb);
        filled[i] += nb;
        pos += nb;
      }
    }
  }
  return out;
}

// Byte offsets of each rank's rows in tensor i: offsets[r] for splits sp.
std::vector<std::int64_t> row_offsets(const std::vector<std::int64_t>& sp, std::int64_t rb) {
  std::vector<std::int64_t> off(sp.size() + 1, 0);
  for (std::size_t r = 0; r < sp.size(); ++r) off[r + 1] = off[r] + sp[r] * rb;
  return off;
}

}  // namespace

std::vector<at::Tensor> allgather_checked(const std::vector<at::Tensor>& ts,
                                          const std::string& local_error, Splits* rows) {
  return gather_rows(ts, -1, local_error, rows);
}

std::vector<at::Tensor> gather_checked(const std::vector<at::Tensor>& ts, std::int64_t root,
                                       const std::string& local_error) {
  env();
  return gather_rows(ts, root, local_error, nullptr);
}

std::vector<at::Tensor> scatter_checked(const std::vector<at::Tensor>& ts, const Splits& splits,
                                        std::int64_t root, const std::string& local_error) {
  const auto& e = env();
  const int n = e.size;
  Signature s;
  std::string msg;
  Splits sp;
  {
    Signature local;
    validate_list(ts, false, true, local_error, local, msg);
    if (local.error == ErrorClass::None) msg = resolve_splits(splits, ts, n, sp);
    s = list_signature(CallKind::Scatter, ts, /*with_dim0=*/true, &sp);
    s.error = local.error != ErrorClass::None ? local.error
              : msg.empty()                   ? ErrorClass::None
                                              : ErrorClass::Value;
  }
  check_root(root, s, msg);
  agree(s, "scatter()", msg, [&] { return describe_list(ts, &sp); });
  const std::size_t k = ts.size();
  if (k == 0) return {};
  std::vector<std::int64_t> part(n, 0);
  for (int r = 0; r < n; ++r) {
    for (std::size_t i = 0; i < k; ++i) part[r] += sp[i][r] * row_bytes(ts[i]);
  }
  check_bytes({sum_of(part)}, "scatter()");
  c10::AutoGradMode no_grad(false);
  std::vector<at::Tensor> out;
  for (std::size_t i = 0; i < k; ++i) out.push_back(with_rows(ts[i], sp[i][e.rank]));
  const bool is_root = e.rank == root;
  Bytes send;
  if (is_root) {
    if (k == 1) {
      send = Bytes(ts[0]);
    } else {
      send = byte_buffer(ts[0], sum_of(part));
      std::vector<Bytes> src;
      std::vector<std::vector<std::int64_t>> off;
      for (std::size_t i = 0; i < k; ++i) {
        src.emplace_back(ts[i]);
        off.push_back(row_offsets(sp[i], row_bytes(ts[i])));
      }
      std::int64_t pos = 0;
      for (int r = 0; r < n; ++r) {
        for (std::size_t i = 0; i < k; ++i) {
          const std::int64_t nb = off[i][r + 1] - off[i][r];
          copy_bytes(send, pos, src[i], off[i][r], nb);
          pos += nb;
        }
      }
    }
  }
  Bytes recv = k == 1 ? Bytes(out[0]) : byte_buffer(ts[0], part[e.rank]);
  backend_for(ts[0]).scatterv(is_root ? send.data() : nullptr, part, recv.data(), part[e.rank],
                              static_cast<int>(root));
  if (k > 1) {
    std::int64_t pos = 0;
    for (std::size_t i = 0; i < k; ++i) {
      Bytes dst(out[i]);
      copy_bytes(dst, 0, recv, pos, dst.n);
      pos += dst.n;
    }
  }
  return out;
}

std::vector<at::Tensor> reduce_scatter_checked(const std::vector<at::Tensor>& ts,
                                               const std::string& opname, const Splits& splits,
                                               const std::string& local_error) {
  const auto& e = env();
  const int n = e.size;
  Signature s;
  std::string msg;
  Splits sp;
  ReduceOp op;
  {
    Signature local;
    op = parse_op_into(opname, local, msg);
    validate_list(ts, false, true, local_error, local, msg);
    if (local.error == ErrorClass::None) msg = resolve_splits(splits, ts, n, sp);
    s = list_signature(CallKind::ReduceScatter, ts, /*with_dim0=*/true, &sp);
    s.op = local.op;
    s.error = local.error != ErrorClass::None ? local.error
              : msg.empty()                   ? ErrorClass::None
                                              : ErrorClass::Value;
  }
  agree(s, "reduce_scatter()", msg, [&] { return describe_list(ts, &sp); });
  const std::size_t k = ts.size();
  std::vector<at::Tensor> out(k);
  if (k == 0) return out;
  c10::AutoGradMode no_grad(false);
  Backend& b = backend_for(ts[0]);
  // One reduce-scatter per dtype, in the order of first appearance (the same on every rank).
  std::vector<bool> done(k, false);
  for (std::size_t first = 0; first < k; ++first) {
    if (done[first]) continue;
    const auto dt = ts[first].scalar_type();
    std::vector<std::size_t> idx;
    for (std::size_t i = first; i < k; ++i) {
      if (!done[i] && ts[i].scalar_type() == dt) {
        idx.push_back(i);
        done[i] = true;
      }
    }
    const auto wire = wire_dtype(dt, op, HalfReduction::Fp32);
    const auto esz = static_cast<std::int64_t>(c10::elementSize(wire));
    std::vector<std::int64_t> counts(n, 0);  // elements of rank r's part
    for (int r = 0; r < n; ++r) {
      for (auto i : idx) counts[r] += sp[i][r] * row_elems(ts[i]);
    }
    check_bytes({sum_of(counts) * esz}, "reduce_scatter()");
    at::Tensor send;
    const at::Tensor& t0 = ts[idx[0]];
    if (idx.size() == 1 && t0.scalar_type() == wire) {
      send = t0.contiguous().reshape({-1});
    } else {
      send = at::empty({sum_of(counts)}, t0.options().dtype(wire));
      std::int64_t pos = 0;
      std::vector<std::int64_t> row(k, 0);  // next row of each tensor
      for (int r = 0; r < n; ++r) {
        for (auto i : idx) {
          const std::int64_t m = sp[i][r] * row_elems(ts[i]);
          if (m > 0) send.narrow(0, pos, m).copy_(ts[i].narrow(0, row[i], sp[i][r]).reshape({-1}));
          row[i] += sp[i][r];
          pos += m;
        }
      }
    }
    at::Tensor recv = at::empty({counts[e.rank]}, t0.options().dtype(wire));
    b.reduce_scatter(send.data_ptr(), recv.data_ptr(), counts, wire, wire_op(op, dt));
    if (op == ReduceOp::Average) divide_by(recv, n);
    std::int64_t pos = 0;
    for (auto i : idx) {
      auto sizes = ts[i].sizes().vec();
      sizes[0] = sp[i][e.rank];
      const std::int64_t m = sizes[0] * row_elems(ts[i]);
      auto piece = recv.narrow(0, pos, m).view(sizes);
      out[i] = idx.size() == 1 ? piece.to(dt) : piece.to(dt, /*non_blocking=*/false, /*copy=*/true);
      pos += m;
    }
  }
  return out;
}

std::vector<at::Tensor> alltoall_checked(const std::vector<at::Tensor>& ts, const Splits& splits,
                                         Splits* received, const std::string& local_error) {
  const auto& e = env();
  const int n = e.size;
  Signature s = list_signature(CallKind::Alltoall, ts, /*with_dim0=*/false, nullptr);
  std::string msg;
  Splits sp;
  validate_list(ts, false, true, local_error, s, msg);
  if (s.error == ErrorClass::None) {
    msg = resolve_splits(splits, ts, n, sp);
    if (!msg.empty()) s.error = ErrorClass::Value;
  }
  // Signature::soft: when every rank has the same splits (equal parts, say), every rank
  // knows what every other sends and the exchange of splits is skipped.
  std::vector<std::int64_t> mine;
  for (const auto& v : sp) mine.insert(mine.end(), v.begin(), v.end());
  if (s.error == ErrorClass::None) {
    s.soft = hash_bytes(mine.data(), mine.size() * sizeof(std::int64_t));
  }
  const bool same = agree(s, "alltoall()", msg, [&] { return describe_list(ts, nullptr); });
  const std::size_t k = ts.size();
  if (received != nullptr) received->assign(k, std::vector<std::int64_t>(n, 0));
  if (k == 0) return {};
  // S[(r * k + i) * n + j]: rows of tensor i that rank r sends to rank j; known on every rank,
  // so the size check below gives the same verdict everywhere.
  std::vector<std::int64_t> S(k * n * n);
  if (same) {
    for (int r = 0; r < n; ++r) std::copy(mine.begin(), mine.end(), S.begin() + r * k * n);
  } else {
    mpi_backend().allgather(mine.data(), S.data(), static_cast<std::int64_t>(k * n), c10::kLong);
  }
  auto at_ = [&](int r, std::size_t i, int j) { return S[(r * k + i) * n + j]; };
  std::vector<std::int64_t> sent(n, 0), got(n, 0);
  for (int r = 0; r < n; ++r) {
    for (std::size_t i = 0; i < k; ++i) {
      for (int j = 0; j < n; ++j) {
        sent[r] += at_(r, i, j) * row_bytes(ts[i]);
        got[j] += at_(r, i, j) * row_bytes(ts[i]);
      }
    }
  }
  check_bytes(sent, "alltoall()");
  check_bytes(got, "alltoall()");
  const int me = e.rank;
  std::vector<std::int64_t> send_bytes(n, 0), recv_bytes(n, 0);
  for (int j = 0; j < n; ++j) {
    for (std::size_t i = 0; i < k; ++i) {
      send_bytes[j] += at_(me, i, j) * row_bytes(ts[i]);
      recv_bytes[j] += at_(j, i, me) * row_bytes(ts[i]);
    }
  }
  c10::AutoGradMode no_grad(false);
  std::vector<at::Tensor> out;
  for (std::size_t i = 0; i < k; ++i) {
    std::int64_t rows = 0;
    for (int j = 0; j < n; ++j) {
      rows += at_(j, i, me);
      if (received != nullptr) (*received)[i][j] = at_(j, i, me);
    }
    out.push_back(with_rows(ts[i], rows));
  }
  Bytes send, recv;
  if (k == 1) {
    send = Bytes(ts[0]);
    recv = Bytes(out[0]);
  } else {
    send = byte_buffer(ts[0], sum_of(send_bytes));
    std::int64_t pos = 0;
    std::vector<Bytes> src;
    std::vector<std::vector<std::int64_t>> off;
    for (std::size_t i = 0; i < k; ++i) {
      src.emplace_back(ts[i]);
      off.push_back(row_offsets(sp[i], row_bytes(ts[i])));
    }
    for (int j = 0; j < n; ++j) {
      for (std::size_t i = 0; i < k; ++i) {
        const std::int64_t nb = off[i][j + 1] - off[i][j];
        copy_bytes(send, pos, src[i], off[i][j], nb);
        pos += nb;
      }
    }
    recv = byte_buffer(ts[0], sum_of(recv_bytes));
  }
  backend_for(ts[0]).alltoallv(send.data(), send_bytes, recv.data(), recv_bytes);
  if (k > 1) {
    std::vector<std::int64_t> filled(k, 0);
    std::int64_t pos = 0;
    for (int j = 0; j < n; ++j) {
      for (std::size_t i = 0; i < k; ++i) {
        const std::int64_t nb = at_(j, i, me) * row_bytes(ts[i]);
        copy_bytes(Bytes(out[i]), filled[i], recv, pos, nb);
        filled[i] += nb;
        pos += nb;
      }
    }
  }
  return out;
}

namespace {

bool cpu_contiguous(const at::Tensor& t) { return t.is_cpu() && t.is_contiguous(); }

// Tensors idx of ts (one dtype) into one flat buffer of that dtype.
at::Tensor pack_flat(const std::vector<at::Tensor>& ts, const std::vector<std::size_t>& idx) {
  std::int64_t total = 0;
  for (auto i : idx) total += ts[i].numel();
  at::Tensor flat = at::empty({total}, ts[idx[0]].options());
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

void grouped_allreduce_checked(const std::vector<at::Tensor>& ts, const std::string& opname,
                               const std::string& local_error) {
  const auto& e = env();
  Signature s = list_signature(CallKind::GroupedAllreduce, ts, /*with_dim0=*/true, nullptr);
  std::string msg;
  ReduceOp op = parse_op_into(opname, s, msg);
  validate_list(ts, /*in_place=*/true, /*rows=*/false, local_error, s, msg);
  agree(s, "grouped_allreduce_()", msg, [&] { return describe_list(ts, nullptr); });
  if (ts.empty()) return;
  c10::AutoGradMode no_grad(false);
  Backend& b = backend_for(ts[0]);
  for (const auto& idx : by_dtype(ts)) {
    if (idx.size() == 1) {
      allreduce_data(b, ts[idx[0]], op, e.size);
      continue;
    }
    at::Tensor flat = pack_flat(ts, idx);
    allreduce_data(b, flat, op, e.size);
    unpack_flat(flat, ts, idx);
  }
}

void grouped_broadcast_checked(const std::vector<at::Tensor>& ts, std::int64_t root,
                               const std::string& local_error) {
  const auto& e = env();
  Signature s = list_signature(CallKind::GroupedBroadcast, ts, /*with_dim0=*/true, nullptr);
  std::string msg;
  validate_list(ts, /*in_place=*/true, /*rows=*/false, local_error, s, msg);
  check_root(root, s, msg);
  agree(s, "grouped_bcast_()", msg, [&] { return describe_list(ts, nullptr); });
  if (ts.empty()) return;
  c10::AutoGradMode no_grad(false);
  Backend& b = backend_for(ts[0]);
  if (ts.size() == 1) {
    broadcast_data(b, ts[0], static_cast<int>(root));
    return;
  }
  // Every dtype as bytes, in one buffer.
  std::int64_t total = 0;
  for (const auto& t : ts) total += t.numel() * static_cast<std::int64_t>(t.element_size());
  Bytes buf = byte_buffer(ts[0], total);
  const bool is_root = e.rank == root;
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
