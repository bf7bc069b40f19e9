// reduce_scatter and alltoall: the row collectives where every rank sends a part to every
// other rank (declared in ops/gather_collectives.h).
#include "ops/gather_collectives.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <atomic>

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
std::atomic<std::int64_t> g_alltoall_block_calls{0};
}  // namespace

std::int64_t alltoall_block_calls() { return g_alltoall_block_calls.load(); }

std::vector<at::Tensor> reduce_scatter_checked(const std::vector<at::Tensor>& ts,
                                               const std::string& opname, const Splits& splits,
                                               const std::string& local_error,
                                               std::int64_t also_agree,
                                               const std::string& also_text) {
  const Group& e = current_group();
  const int n = e.size();
  Signature s;
  std::string msg;
  Splits sp;
  ReduceOp op;
  std::vector<at::Tensor> ps;  // what moves: complex tensors as pairs of reals in a sum or average
  {
    Signature local;
    op = parse_op_into(opname, local, msg);
    const bool pairs = op == ReduceOp::Sum || op == ReduceOp::Average;
    // (A 0-dim tensor stays as it is: its pairs would make a dim 0 it does not have.)
    for (const auto& t : ts) ps.push_back(pairs && t.defined() && t.dim() > 0 ? as_pairs(t) : t);
    validate_list(ps, false, true, local_error, local, msg);
    for (const auto& t : ps) check_op_dtype(op, t, local, msg);
    if (local.error == ErrorClass::None) msg = resolve_splits(splits, ps, n, sp);
    // The tensors themselves, so that a complex tensor and its pairs as reals disagree.
    s = list_signature(CallKind::ReduceScatter, ts, /*with_dim0=*/true, &sp);
    s.op = local.op;
    s.error = local.error != ErrorClass::None ? local.error
              : msg.empty()                   ? ErrorClass::None
                                              : ErrorClass::Value;
  }
  if (also_agree != 0) s.detail = hash_bytes(&also_agree, sizeof(also_agree), s.detail);
  agree(s, "reduce_scatter()", msg, [&] { return describe_list(ts, &sp) + also_text; });
  const std::size_t k = ps.size();
  std::vector<at::Tensor> out(k);
  if (k == 0) return out;
  c10::AutoGradMode no_grad(false);
  Backend& b = backend_for(ps[0]);
  // One reduce-scatter per dtype, in the order of first appearance (the same on every rank).
  std::vector<bool> done(k, false);
  for (std::size_t first = 0; first < k; ++first) {
    if (done[first]) continue;
    const auto dt = ps[first].scalar_type();
    std::vector<std::size_t> idx;
    for (std::size_t i = first; i < k; ++i) {
      if (!done[i] && ps[i].scalar_type() == dt) {
        idx.push_back(i);
        done[i] = true;
      }
    }
    const auto wire = wire_dtype(dt, op, HalfReduction::Fp32);
    const auto esz = static_cast<std::int64_t>(c10::elementSize(wire));
    std::vector<std::int64_t> counts(n, 0);  // elements of rank r's part
    for (int r = 0; r < n; ++r) {
      for (auto i : idx) counts[r] += sp[i][r] * row_elems(ps[i]);
    }
    check_bytes({sum_of(counts) * esz}, "reduce_scatter()");
    const at::Tensor& t0 = ps[idx[0]];
    if (idx.size() == 1 && t0.scalar_type() == wire) {
      // The common call: read the input as flat and return the output tensor itself (no
      // reshape, narrow or view: each ATen call costs about a microsecond here).
      const at::Tensor send = t0.contiguous();
      auto sizes = t0.sizes().vec();
      sizes[0] = sp[idx[0]][e.rank()];
      at::Tensor recv = new_output(sizes, t0.options());
      b.reduce_scatter(send.data_ptr(), recv.data_ptr(), counts, wire, wire_op(op, dt));
      if (op == ReduceOp::Average) divide_by(recv, n);
      out[idx[0]] = recv;
      continue;
    }
    at::Tensor send = new_output({sum_of(counts)}, t0.options().dtype(wire));
    std::int64_t pos = 0;
    std::vector<std::int64_t> row(k, 0);  // next row of each tensor
    for (int r = 0; r < n; ++r) {
      for (auto i : idx) {
        const std::int64_t m = sp[i][r] * row_elems(ps[i]);
        if (m > 0) send.narrow(0, pos, m).copy_(ps[i].narrow(0, row[i], sp[i][r]).reshape({-1}));
        row[i] += sp[i][r];
        pos += m;
      }
    }
    at::Tensor recv = new_output({counts[e.rank()]}, t0.options().dtype(wire));
    b.reduce_scatter(send.data_ptr(), recv.data_ptr(), counts, wire, wire_op(op, dt));
    if (op == ReduceOp::Average) divide_by(recv, n);
    pos = 0;
    for (auto i : idx) {
      auto sizes = ps[i].sizes().vec();
      sizes[0] = sp[i][e.rank()];
      const std::int64_t m = sizes[0] * row_elems(ps[i]);
      auto piece = recv.narrow(0, pos, m).view(sizes);
      out[i] = idx.size() == 1 ? piece.to(dt) : piece.to(dt, /*non_blocking=*/false, /*copy=*/true);
      pos += m;
    }
  }
  for (std::size_t i = 0; i < k; ++i) {
    if (ts[i].is_complex() && !out[i].is_complex()) out[i] = at::view_as_complex(out[i]);
  }
  return out;
}

std::vector<at::Tensor> alltoall_checked(const std::vector<at::Tensor>& ts, const Splits& splits,
                                         Splits* received, const std::string& local_error,
                                         std::int64_t also_agree, const std::string& also_text) {
  const Group& e = current_group();
  const int n = e.size();
  Signature s = list_signature(CallKind::Alltoall, ts, /*with_dim0=*/false, nullptr);
  std::string msg;
  Splits sp;
  validate_list(ts, false, true, local_error, s, msg, /*bytes=*/true);
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
  if (also_agree != 0) s.detail = hash_bytes(&also_agree, sizeof(also_agree), s.detail);
  const bool same =
      agree(s, "alltoall()", msg, [&] { return describe_list(ts, nullptr) + also_text; });
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
  const int me = e.rank();
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
  // Every rank sends every rank the same rows of each tensor: all parts have one length, and
  // the block form (MPI_Alltoall) serves. S is the same on every rank, so every rank takes the
  // same call.
  bool equal = true;
  for (int r = 0; r < n && equal; ++r) {
    for (std::size_t i = 0; i < k && equal; ++i) {
      for (int j = 0; j < n && equal; ++j) equal = at_(r, i, j) == at_(0, i, 0);
    }
  }
  if (equal) {
    ++g_alltoall_block_calls;
    backend_for(ts[0]).alltoall_equal(send.data(), recv.data(), send_bytes[0], n);
  } else {
    backend_for(ts[0]).alltoallv(send.data(), send_bytes, recv.data(), recv_bytes);
  }
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

}  // namespace fluxmpi
