#include "ops/consensus.h"

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <sstream>
#include <vector>

#include "backend/backend.h"
#include "runtime/environment.h"
#include "runtime/group.h"
#include "runtime/user_call.h"

namespace fluxmpi {

const char* kind_name(CallKind k) {
  switch (k) {
    case CallKind::Allreduce: return "allreduce_";
    case CallKind::Broadcast: return "bcast_";
    case CallKind::Reduce: return "reduce_";
    case CallKind::Barrier: return "barrier";
    case CallKind::GradientBuckets: return "gradient allreduce";
    case CallKind::CoalescedBroadcast: return "synchronize_ (tensors)";
    case CallKind::ObjectBroadcast: return "synchronize_ (objects)";
    case CallKind::Allgather: return "allgather";
    case CallKind::Gather: return "gather";
    case CallKind::Scatter: return "scatter";
    case CallKind::ReduceScatter: return "reduce_scatter";
    case CallKind::Alltoall: return "alltoall";
    case CallKind::GroupedAllreduce: return "grouped_allreduce_";
    case CallKind::GroupedBroadcast: return "grouped_bcast_";
    case CallKind::ObjectBcast: return "broadcast_object";
    case CallKind::ObjectAllgather: return "allgather_object";
    case CallKind::NewGroup: return "new_group";
  }
  return "unknown collective";
}

void raise_on_every_rank(ErrorClass cls, const std::string& msg) {
  throw RaisedOnEveryRank(cls == ErrorClass::None ? ErrorClass::Runtime : cls, msg);
}

void raise_error(ErrorClass cls, const std::string& msg) {
  switch (cls) {
    case ErrorClass::Value: TORCH_CHECK_VALUE(false, msg);
    case ErrorClass::Type: TORCH_CHECK_TYPE(false, msg);
    default: TORCH_CHECK(false, msg);
  }
}

namespace {

constexpr int kFields = 7;
constexpr std::size_t kCallBytes = 96;   // the user call's name (runtime/user_call.h)
constexpr std::size_t kTextBytes = 480;  // the error or the argument's description
constexpr std::size_t kRankBytes = kCallBytes + kTextBytes;

void pack(const Signature& s, std::int64_t* v) {
  v[0] = static_cast<std::int64_t>(s.kind);
  v[1] = s.op;
  v[2] = s.root;
  v[3] = s.dtype;
  v[4] = s.numel;
  v[5] = s.detail;
  v[6] = static_cast<std::int64_t>(s.error);
}

std::string field_value(int field, std::int64_t v) {
  switch (field) {
    case 0: return kind_name(static_cast<CallKind>(v));
    case 1:
      if (v == kPremulSumSignatureOp) return "premul_sum";
      return v < 0 ? "none" : op_name(static_cast<ReduceOp>(v));
    case 3: return v < 0 ? "none" : dtype_name(static_cast<c10::ScalarType>(v));
    default: return std::to_string(v);
  }
}

const char* field_name(int field) {
  static const char* names[kFields] = {"collective", "op",    "root_rank", "dtype",
                                       "numel",      "shape", "error"};
  return names[field];
}

// `names[r]`: the world rank of the group's rank r; `where`: "" on the world, else " (on
// group [0, 2])", added to every message.
[[noreturn]] void report(const std::vector<std::int64_t>& sigs, const std::vector<char>& texts,
                         int size, const std::vector<int>& names, const std::string& where) {
  auto field_of = [&](int r, std::size_t offset, std::size_t len) {
    const char* t = texts.data() + r * kRankBytes + offset;
    return std::string(t, strnlen(t, len));
  };
  auto call_of = [&](int r) { return field_of(r, 0, kCallBytes); };
  auto text_of = [&](int r) { return field_of(r, kCallBytes, kTextBytes); };
  // Which user call each rank is in (runtime/user_call.h).
  bool same_call = true;
  for (int r = 1; r < size; ++r) same_call &= call_of(r) == call_of(0);
  std::ostringstream calls;
  for (int r = 0; r < size; ++r)
    calls << (r ? "; " : "") << "rank " << names[r] << " in " << call_of(r);
  std::ostringstream msg;
  // Local errors first: they explain the rest.
  ErrorClass cls = ErrorClass::None;
  for (int r = 0; r < size; ++r) {
    auto e = static_cast<ErrorClass>(sigs[r * kFields + 6]);
    if (e == ErrorClass::None) continue;
    if (cls == ErrorClass::None) {
      cls = e;
      msg << call_of(r) << ": ";
    } else {
      msg << "; ";
    }
    msg << "rank " << names[r] << ": " << text_of(r);
  }
  if (cls != ErrorClass::None) {
    if (!same_call) msg << " (the ranks were in different calls: " << calls.str() << ")";
    raise_on_every_rank(cls, msg.str() + where);
  }
  constexpr const char* kAdvice =
      " Every rank must make the same collective calls, in the same order, with tensors of the "
      "same shape and dtype.";
  if (!same_call) {
    // Ranks inside different calls: that is the story, whatever else differs.
    msg << "ranks are in different calls:";
    for (int r = 0; r < size; ++r) {
      msg << (r ? ";" : "") << " rank " << names[r] << " is in " << call_of(r);
      auto t = text_of(r);
      if (!t.empty()) msg << " (" << t << ")";
    }
    msg << where << "." << kAdvice;
    raise_on_every_rank(ErrorClass::Runtime, msg.str());
  }
  // Otherwise name the first field that differs, each rank's value, and the argument.
  for (int f = 0; f < kFields - 1; ++f) {
    std::int64_t ref = sigs[f];
    bool differs = false;
    for (int r = 1; r < size; ++r) differs |= sigs[r * kFields + f] != ref;
    if (!differs) continue;
    msg << call_of(0) << ": ranks disagree on " << field_name(f) << ":";
    for (int r = 0; r < size; ++r) {
      msg << (r ? ";" : "") << " rank " << names[r] << " has ";
      if (f == 5) {
        msg << text_of(r);
      } else {
        msg << field_value(f, sigs[r * kFields + f]);
        auto t = text_of(r);
        if (!t.empty()) msg << " (" << t << ")";
      }
    }
    msg << where << "." << kAdvice;
    break;
  }
  raise_on_every_rank(ErrorClass::Runtime, msg.str());
}

}  // namespace

void check_root(std::int64_t root, Signature& s, std::string& msg) {
  s.root = root;
  const int size = current_group().size();
  if (s.error == ErrorClass::None && (root < 0 || root >= size)) {
    s.error = ErrorClass::Value;
    msg = "root_rank " + std::to_string(root) + " is out of range; expected 0 <= root_rank < " +
          std::to_string(size);
  }
}

std::string dtype_name(c10::ScalarType t) {
  return "torch." + std::string(c10::getDtypeNames(t).first);
}

bool agree(const Signature& sig, const std::string& what, const std::string& text, bool* vetoed) {
  return agree(sig, what, text, [&] { return text; }, vetoed);
}

bool agree(const Signature& sig, const std::string& what, const std::string& error_text,
           const std::function<std::string()>& describe, bool* vetoed) {
  const Group& e = current_group();
  if (vetoed != nullptr) *vetoed = false;
  const char* call = user_call_or(what.c_str());
  if (e.size() == 1) {
    if (sig.error != ErrorClass::None) {
      raise_on_every_rank(sig.error, std::string(call) + ": rank " +
                                         std::to_string(e.world_ranks()[0]) + ": " + error_text);
    }
    return sig.soft_flag == 0;
  }
  // The checked fields and `soft`, then their negatives (max of -x is -min), then soft_flag
  // and veto.
  constexpr int n = kFields + 1;
  std::int64_t v[2 * n + 2];
  pack(sig, v);
  v[kFields] = sig.soft;
  for (int i = 0; i < n; ++i) v[n + i] = -v[i];
  v[2 * n] = sig.soft_flag != 0 ? 1 : 0;
  v[2 * n + 1] = sig.veto != 0 ? 1 : 0;
  mpi_backend().allreduce(v, 2 * n + 2, c10::kLong, ReduceOp::Max);
  if (vetoed != nullptr) *vetoed = v[2 * n + 1] != 0;
  bool same = true;
  for (int i = 0; i < kFields; ++i) same &= (v[i] == -v[n + i]);
  if (same && sig.error == ErrorClass::None) return v[kFields] == -v[n + kFields] && v[2 * n] == 0;
  // Slow path, identical on every rank: gather signatures and texts, then raise everywhere.
  std::int64_t mine[kFields];
  pack(sig, mine);
  std::vector<std::int64_t> sigs(static_cast<std::size_t>(kFields) * e.size());
  mpi_backend().allgather(mine, sigs.data(), kFields, c10::kLong);
  const std::string text = sig.error != ErrorClass::None ? error_text : describe();
  const std::string call_name = call;
  std::vector<char> mine_text(kRankBytes, 0), texts(kRankBytes * e.size());
  std::memcpy(mine_text.data(), call_name.data(), std::min(call_name.size(), kCallBytes - 1));
  std::memcpy(mine_text.data() + kCallBytes, text.data(), std::min(text.size(), kTextBytes - 1));
  mpi_backend().allgather(mine_text.data(), texts.data(), kRankBytes, c10::kByte);
  report(sigs, texts, e.size(), e.world_ranks(),
         e.is_world() ? std::string() : " (on group " + e.describe() + ")");
}

}  // namespace fluxmpi
