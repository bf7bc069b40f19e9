#include "ops/consensus.h"

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <sstream>
#include <vector>

#include "backend/backend.h"
#include "ops/agreement_count.h"
#include "ops/carried.h"
#include "runtime/environment.h"
#include "runtime/group.h"
#include "runtime/stop_request.h"
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
    case CallKind::JoinRound: return "join round";
    case CallKind::ExactShardBucket: return "deterministic gradient bucket";
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

// The lanes of an agreement's allreduce (max): the checked fields and `soft`, then their
// negatives (max of -x is -min), then soft_flag and veto, joinable and its negative, the
// joined ranks' marks: their join's mode and the lowest joined rank, and on the world a stop
// that some rank marked (runtime/stop_request.h): the agreement carries it at no extra call;
// last the bytes each rank's call offered to carry and their negative (ops/carried.h).
constexpr int kChecked = kFields + 1;
constexpr int kSoftFlag = 2 * kChecked;
constexpr int kVeto = kSoftFlag + 1;
constexpr int kJoinable = kVeto + 1;  // and kJoinable + 1
constexpr int kJoinMode = kJoinable + 2;
constexpr int kLowestJoined = kJoinMode + 1;  // size - rank: the max is the lowest rank
constexpr int kStop = kLowestJoined + 1;
constexpr int kCarry = kStop + 1;  // and kCarry + 1
constexpr int kLanes = kCarry + 2;
// What a joined rank puts in every checked lane: the identity of max.
constexpr std::int64_t kNeutral = std::numeric_limits<std::int64_t>::min();
// A joined rank's `kind` in the slow path's gather (no CallKind is 0).
constexpr std::int64_t kJoinedKind = 0;
// kJoinMode's values: 0 when no rank has joined.
constexpr std::int64_t kModeShadows = 1;  // hvd.join(): allreduces and rounds
constexpr std::int64_t kModeRigid = 2;    // fluxmpi_py.Join: rounds only

std::atomic<std::int64_t> g_world_agreements{0};
// This thread's agreements on any group: a public call that raises before its own first one
// has not met the other ranks yet (thread_agreements()).
thread_local std::int64_t t_agreements = 0;

// FNV-1a of the name, folded into `detail`: equal names give equal lanes on every rank.
std::uint64_t mix_name(std::int64_t detail, const char* name) {
  std::uint64_t h = 1469598103934665603ull;
  for (const char* c = name; *c; ++c) h = (h ^ static_cast<unsigned char>(*c)) * 1099511628211ull;
  return static_cast<std::uint64_t>(detail) ^ h;
}

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
      if (v == kGlooSumSignatureOp) return "sum in gloo's order (fluxmpi_py.set_sum_order)";
      if (v == kGlooPremulSumSignatureOp) return "premul_sum in gloo's order";
      return v < 0 ? "none" : op_name(static_cast<ReduceOp>(v));
    case 3: return v < 0 ? "none" : dtype_name(static_cast<c10::ScalarType>(v));
    default: return std::to_string(v);
  }
}

// `kind`: the call's (every rank's, once the names differ no more in field 0).
const char* field_name(int field, std::int64_t kind) {
  static const char* names[kFields] = {"collective", "op",    "root_rank", "dtype",
                                       "numel",      "shape", "error"};
  if (field == 4) {  // what `numel` counts in the list calls (consensus.h)
    const auto k = static_cast<CallKind>(kind);
    if (k >= CallKind::Allgather && k <= CallKind::GroupedBroadcast) return "the number of tensors";
    if (k == CallKind::NewGroup) return "the number of ranks";
  }
  return names[field];
}

// Whether the descriptions differ, and only in how they end on requires_grad.
bool differ_in_grad_only(const std::vector<std::string>& texts) {
  auto strip = [](std::string t) {
    for (const char* end : {kNotRequiringGradText, kRequiringGradText}) {
      const auto at = t.find(end);
      if (at != std::string::npos) t.erase(at, std::strlen(end));
    }
    return t;
  };
  bool differ = false, same_stripped = true;
  const std::string first = strip(texts[0]);
  for (std::size_t r = 1; r < texts.size(); ++r) {
    differ |= texts[r] != texts[0];
    same_stripped &= strip(texts[r]) == first;
  }
  return differ && same_stripped;
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
    std::string name = field_name(f, sigs[0]);
    if (f == 5) {
      std::vector<std::string> texts;
      for (int r = 0; r < size; ++r) texts.push_back(text_of(r));
      if (differ_in_grad_only(texts)) name = "requires_grad";
    }
    msg << call_of(0) << ": ranks disagree on " << name << ":";
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

// True when the active ranks' signatures differ or carry an error: the slow path, taken by
// every rank of the group (the joined ones too: they see the same lanes).
bool needs_report(const std::int64_t* v) {
  for (int i = 0; i < kFields; ++i) {
    if (v[i] != -v[kChecked + i]) return true;
  }
  return v[6] != static_cast<std::int64_t>(ErrorClass::None);
}

// The room the group's next agreement makes (ops/carried.h): what this call offered to carry,
// when every active rank offered the same and the call is good; a function of the agreed lanes
// alone, so every rank of the group (the joined ones too) sets the same.
std::int64_t next_room(const std::int64_t* v) {
  if (v[0] == kNeutral || v[kCarry] == kNeutral || needs_report(v)) return 0;
  const std::int64_t bytes = v[kCarry];
  return bytes == -v[kCarry + 1] && bytes > 0 && bytes <= kMaxCarryBytes ? bytes : 0;
}

// One agreement's allreduce over the current group, counted when it is the world. On the
// world it carries this rank's stop mark, and every rank records the stop at the same one.
// `carry`: the call's data, where the group's room lets it ride along (ops/carried.h).
void exchange(std::int64_t* v, const Group& e, Carry* carry = nullptr) {
  v[kStop] = e.is_world() ? stop_lane() : 0;
  // The direct path's data reaches the caller only where the call passed on every rank (no
  // report, no rank joined): every rank decides that from the same lanes.
  exchange_lanes(v, kLanes, e, carry,
                 [](const std::int64_t* w) { return !needs_report(w) && w[kJoinMode] == 0; });
  set_carry_room(e, next_room(v));
  ++t_agreements;
  if (e.is_world()) {
    g_world_agreements.fetch_add(1, std::memory_order_relaxed);
    note_stop_lane(v[kStop]);
  }
}

bool soft_same(const std::int64_t* v) { return v[kFields] == -v[kChecked + kFields]; }

// The active ranks' Joinable: No unless every one of them gave the same.
Joinable agreed_joinable(const std::int64_t* v) {
  return v[kJoinable] == -v[kJoinable + 1] ? static_cast<Joinable>(v[kJoinable]) : Joinable::No;
}

// Whether the joined ranks take part in the call (else it raises on every rank).
bool joined_take_part(const std::int64_t* v) {
  const Joinable j = agreed_joinable(v);
  return j == Joinable::Round || (j == Joinable::Allreduce && v[kJoinMode] == kModeShadows);
}

// Why a call that ranks have joined in the middle of cannot run, on group `e`.
std::string refusal(const std::int64_t* v, const Group& e) {
  const int lowest = e.world_ranks()[e.size() - v[kLowestJoined]];
  const std::string kind = kind_name(static_cast<CallKind>(v[0]));
  const std::string on = e.is_world() ? std::string() : " on the process set " + e.describe();
  if (v[kJoinMode] == kModeRigid) {
    return "rank " + std::to_string(lowest) +
           " has left its fluxmpi_py.Join block and waits there; inside a join only the steps "
           "of the Join's DistributedOptimizers may communicate, not this " +
           kind + on;
  }
  return "rank " + std::to_string(lowest) +
         " has joined (hvd.join()): until every rank has, the joined ranks take part only in "
         "allreduces (of the world and of the process sets they are in) and in "
         "hvd.DistributedOptimizer steps, not in this " +
         kind + on;
}

// The slow path, identical on every rank: gather signatures and texts, then raise everywhere.
// `sig` is null on a joined rank, which the story leaves out (it is in no call).
[[noreturn]] void report_all(const Signature* sig, const std::string& call_name,
                             const std::string& text, const Group& e) {
  std::int64_t mine[kFields] = {kJoinedKind};
  if (sig != nullptr) pack(*sig, mine);
  std::vector<std::int64_t> all(static_cast<std::size_t>(kFields) * e.size());
  mpi_backend().allgather(mine, all.data(), kFields, c10::kLong);
  std::vector<char> mine_text(kRankBytes, 0), all_texts(kRankBytes * e.size());
  std::memcpy(mine_text.data(), call_name.data(), std::min(call_name.size(), kCallBytes - 1));
  std::memcpy(mine_text.data() + kCallBytes, text.data(), std::min(text.size(), kTextBytes - 1));
  mpi_backend().allgather(mine_text.data(), all_texts.data(), kRankBytes, c10::kByte);
  std::vector<std::int64_t> sigs;
  std::vector<char> texts;
  std::vector<int> names;
  for (int r = 0; r < e.size(); ++r) {
    if (all[r * kFields] == kJoinedKind) continue;
    sigs.insert(sigs.end(), all.begin() + r * kFields, all.begin() + (r + 1) * kFields);
    texts.insert(texts.end(), all_texts.begin() + r * kRankBytes,
                 all_texts.begin() + (r + 1) * kRankBytes);
    names.push_back(e.world_ranks()[r]);
  }
  report(sigs, texts, static_cast<int>(names.size()), names,
         e.is_world() ? std::string() : " (on group " + e.describe() + ")");
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

bool agree(const Signature& sig, const std::string& what, const std::string& text, bool* vetoed,
           bool* joined) {
  return agree(sig, what, text, [&] { return text; }, vetoed, joined);
}

bool agree(const Signature& sig, const std::string& what, const std::string& error_text,
           const std::function<std::string()>& describe, bool* vetoed, bool* joined, Carry* carry) {
  const Group& e = current_group();
  if (vetoed != nullptr) *vetoed = false;
  if (joined != nullptr) *joined = false;
  TORCH_INTERNAL_ASSERT(sig.joinable == Joinable::No || joined != nullptr,
                        "a joinable call must learn whether ranks have joined");
  const char* call = user_call_or(what.c_str());
  if (e.size() == 1) {
    if (e.is_world()) note_stop_lane(stop_lane());  // a world of one agrees with itself
    if (sig.error != ErrorClass::None) {
      raise_on_every_rank(sig.error, std::string(call) + ": rank " +
                                         std::to_string(e.world_ranks()[0]) + ": " + error_text);
    }
    return sig.soft_flag == 0;
  }
  // A checked call name (runtime/user_call.h: a name= or a call site) enters the comparison
  // through `detail`; where it differs, the report tells the ranks' calls apart by their names.
  Signature mine = sig;
  if (user_call_checked()) mine.detail = static_cast<std::int64_t>(mix_name(sig.detail, call));
  std::int64_t v[kLanes];
  pack(mine, v);
  v[kFields] = sig.soft;
  for (int i = 0; i < kChecked; ++i) v[kChecked + i] = -v[i];
  v[kSoftFlag] = sig.soft_flag != 0 ? 1 : 0;
  v[kVeto] = sig.veto != 0 ? 1 : 0;
  v[kJoinable] = static_cast<std::int64_t>(sig.joinable);
  v[kJoinable + 1] = -v[kJoinable];
  v[kJoinMode] = 0;
  v[kLowestJoined] = 0;
  v[kCarry] = sig.carry_bytes;
  v[kCarry + 1] = -sig.carry_bytes;
  exchange(v, e, carry);
  if (vetoed != nullptr) *vetoed = v[kVeto] != 0;
  if (needs_report(v)) {
    report_all(&mine, call, sig.error != ErrorClass::None ? error_text : describe(), e);
  }
  if (v[kJoinMode] != 0) {
    if (!joined_take_part(v)) {
      raise_on_every_rank(ErrorClass::Runtime, std::string(call) + ": " + refusal(v, e));
    }
    *joined = true;
  }
  if (carry != nullptr && carry->carried) note_carried();
  return soft_same(v) && v[kSoftFlag] == 0;
}

JoinedView agree_as_joined(bool rigid) {
  const Group& e = current_group();
  TORCH_INTERNAL_ASSERT(e.size() > 1, "a join waits on a group of several ranks");
  std::int64_t v[kLanes];
  std::fill(v, v + kLanes, kNeutral);
  v[kSoftFlag] = 0;
  v[kVeto] = 0;
  v[kJoinMode] = rigid ? kModeRigid : kModeShadows;
  v[kLowestJoined] = e.size() - e.rank();
  exchange(v, e);
  JoinedView out;
  if (v[0] == kNeutral) {  // every rank is here
    out.all_joined = true;
    return out;
  }
  if (needs_report(v)) report_all(nullptr, rigid ? "fluxmpi_py.Join" : "hvd.join()", "joined", e);
  if (!joined_take_part(v)) raise_on_every_rank(ErrorClass::Runtime, refusal(v, e));
  Signature& s = out.sig;
  s.kind = static_cast<CallKind>(v[0]);
  s.op = v[1];
  s.root = v[2];
  s.dtype = v[3];
  s.numel = v[4];
  s.detail = v[5];
  s.soft = v[kFields];
  s.joinable = agreed_joinable(v);
  out.soft_same = soft_same(v);
  return out;
}

void share_with_joined(AllreduceParts& p, bool is_joined) {
  constexpr int kMaxParts = 16;  // more than the supported dtypes: one part per dtype at most
  constexpr int n = 2 + 3 * kMaxParts;
  std::int64_t v[n];
  std::fill(v, v + n, -1);  // below every value an active rank sends
  if (!is_joined) {
    TORCH_INTERNAL_ASSERT(p.parts.size() <= kMaxParts, "too many parts for a joined rank");
    v[0] = static_cast<std::int64_t>(p.device);
    v[1] = static_cast<std::int64_t>(p.parts.size());
    for (std::size_t i = 0; i < p.parts.size(); ++i) {
      v[2 + 3 * i] = static_cast<std::int64_t>(p.parts[i].dtype);
      v[3 + 3 * i] = p.parts[i].numel;
      v[4 + 3 * i] = p.parts[i].list ? 1 : 0;
    }
  }
  mpi_backend().allreduce(v, n, c10::kLong, ReduceOp::Max);
  if (!is_joined) return;
  p.device = static_cast<c10::DeviceType>(v[0]);
  p.parts.clear();
  for (std::int64_t i = 0; i < v[1]; ++i) {
    p.parts.push_back(
        {static_cast<c10::ScalarType>(v[2 + 3 * i]), v[3 + 3 * i], v[4 + 3 * i] == 1});
  }
}

std::int64_t world_agreements() { return g_world_agreements.load(std::memory_order_relaxed); }

std::int64_t thread_agreements() { return t_agreements; }

}  // namespace fluxmpi
