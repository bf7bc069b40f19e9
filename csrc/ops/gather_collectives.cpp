// allgather, gather and scatter: the row collectives rooted in one gather or scatter of rows.
#include "ops/gather_collectives.h"

#include <ATen/ATen.h>
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

std::vector<at::Tensor> gather_rows(const std::vector<at::Tensor>& ts, std::int64_t root,
                                    const std::string& local_error, Splits* rows_out,
                                    std::int64_t also_agree = 0,
                                    const std::string& also_text = {}) {
  const Group& e = current_group();
  const bool all = root < 0;
  const char* what = all ? "allgather()" : "gather()";
  Signature s =
      list_signature(all ? CallKind::Allgather : CallKind::Gather, ts, /*with_dim0=*/false, {});
  std::string msg;
  validate_list(ts, /*in_place=*/false, /*rows=*/true, local_error, s, msg, /*bytes=*/true);
  if (!all) check_root(root, s, msg);
  if (also_agree != 0) s.detail = hash_bytes(&also_agree, sizeof(also_agree), s.detail);
  if (s.error == ErrorClass::None) s.soft = rows_hash(ts);
  const bool same = agree(s, what, msg, [&] { return describe_list(ts, nullptr) + also_text; });
  if (ts.empty()) return {};
  const int n = e.size();
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
  const bool receives = all || e.rank() == root;
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
    send = byte_buffer(ts[0], part[e.rank()]);
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
    b.allgatherv(send.data(), part[e.rank()], recv_ptr, part);
  } else {
    b.gatherv(send.data(), part[e.rank()], recv_ptr, part, static_cast<int>(root));
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

}  // namespace

std::vector<at::Tensor> allgather_checked(const std::vector<at::Tensor>& ts,
                                          const std::string& local_error, Splits* rows,
                                          std::int64_t also_agree, const std::string& also_text) {
  return gather_rows(ts, -1, local_error, rows, also_agree, also_text);
}

std::vector<at::Tensor> gather_checked(const std::vector<at::Tensor>& ts, std::int64_t root,
                                       const std::string& local_error, Splits* rows,
                                       std::int64_t also_agree, const std::string& also_text) {
  current_group();  // "call Init first"
  return gather_rows(ts, root, local_error, rows, also_agree, also_text);
}

std::vector<at::Tensor> scatter_checked(const std::vector<at::Tensor>& ts, const Splits& splits,
                                        std::int64_t root, const std::string& local_error,
                                        std::int64_t also_agree, const std::string& also_text) {
  const Group& e = current_group();
  const int n = e.size();
  Signature s;
  std::string msg;
  Splits sp;
  {
    Signature local;
    validate_list(ts, false, true, local_error, local, msg, /*bytes=*/true);
    if (local.error == ErrorClass::None) msg = resolve_splits(splits, ts, n, sp);
    s = list_signature(CallKind::Scatter, ts, /*with_dim0=*/true, &sp);
    s.error = local.error != ErrorClass::None ? local.error
              : msg.empty()                   ? ErrorClass::None
                                              : ErrorClass::Value;
  }
  check_root(root, s, msg);
  if (also_agree != 0) s.detail = hash_bytes(&also_agree, sizeof(also_agree), s.detail);
  agree(s, "scatter()", msg, [&] { return describe_list(ts, &sp) + also_text; });
  const std::size_t k = ts.size();
  if (k == 0) return {};
  std::vector<std::int64_t> part(n, 0);
  for (int r = 0; r < n; ++r) {
    for (std::size_t i = 0; i < k; ++i) part[r] += sp[i][r] * row_bytes(ts[i]);
  }
  check_bytes({sum_of(part)}, "scatter()");
  c10::AutoGradMode no_grad(false);
  std::vector<at::Tensor> out;
  for (std::size_t i = 0; i < k; ++i) out.push_back(with_rows(ts[i], sp[i][e.rank()]));
  const bool is_root = e.rank() == root;
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
  Bytes recv = k == 1 ? Bytes(out[0]) : byte_buffer(ts[0], part[e.rank()]);
  backend_for(ts[0]).scatterv(is_root ? send.data() : nullptr, part, recv.data(), part[e.rank()],
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

}  // namespace fluxmpi
