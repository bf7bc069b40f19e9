// The cross-rank check that runs before any data moves. Every collective first calls agree()
// with a small signature of what this rank is about to do. In the common case that costs one
// max over the ranks of 25 int64 lanes (max of v and of -v gives min and max at once; ranks
// that have joined take part with neutral values and a mark, see ops/join.h): on a group of up
// to 4 ranks each rank's lanes go to every other rank, point to point, and a small call's data
// travels beside them (backend/direct.h); on a larger group one allreduce, where a small call's
// data rides in the same message when the group's previous agreement made room
// (ops/carried.h). Either way no data moves before the check, and a small call costs the
// check's messages alone. When any rank reported
// a local error or the signatures differ, all ranks gather everyone's signature and text and
// raise the same exception, naming the ranks and the values that differ. Either way every
// rank leaves agree() together, so a bad input can never leave a rank waiting in a collective.
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace fluxmpi {

// Which collective a rank is in. Ranks in different collectives disagree on `kind`.
enum class CallKind : std::int64_t {
  Allreduce = 1,
  Broadcast = 2,
  Reduce = 3,
  Barrier = 4,
  GradientBuckets = 6,     // the DistributedOptimizer's fused reduction (plan hash in `detail`)
  CoalescedBroadcast = 7,  // synchronize_'s packed tensors
  ObjectBroadcast = 8,     // pickled skeletons
  // ops/gather_collectives.h and ops/object_collectives.h; `numel` is the number of tensors
  // and `detail` hashes their dtypes and shapes (and agreed splits).
  Allgather = 9,
  Gather = 10,
  Scatter = 11,
  ReduceScatter = 12,
  Alltoall = 13,
  GroupedAllreduce = 14,
  GroupedBroadcast = 15,
  ObjectBcast = 16,  // broadcast_object
  ObjectAllgather = 17,
  NewGroup = 18,   // runtime/group.h; `numel` is the number of ranks, `detail` hashes them
  JoinRound = 19,  // ops/join.h: a join's per-step round (the optimizer's index in `soft`)
  // ops/exact_shards.h: one bucket of DistributedOptimizer(deterministic=True), its index in
  // `detail`
  ExactShardBucket = 20,
};

const char* kind_name(CallKind k);

// What a call does when some rank has joined (ops/join.h: it waits in agree_as_joined).
enum class Joinable : std::int64_t {
  No = 0,         // the call raises on every rank: the joined ranks cannot take part
  Allreduce = 1,  // the joined ranks reduce zeros with it (see share_with_joined), unless
                  // their join is a fluxmpi_py.Join (those answer rounds only)
  Round = 2,      // a join round (ops/join.h): the joined ranks count themselves out
};

// Exception class that a local error should become on every rank.
enum class ErrorClass : std::int64_t { None = 0, Value = 1, Type = 2, Runtime = 3 };

// Signature::op of torch's PREMUL_SUM (a sum of premultiplied copies; ops/collectives.h
// PremulSumScope): past the last ReduceOp, so that it differs from a plain sum.
constexpr std::int64_t kPremulSumSignatureOp = 100;
// Signature::op of a sum, and of torch's PREMUL_SUM, in gloo's order (SumOrder::Gloo:
// ops/collectives.h sign_sum_order).
constexpr std::int64_t kGlooSumSignatureOp = 101;
constexpr std::int64_t kGlooPremulSumSignatureOp = 102;

// How the row collectives' descriptions end (python/bind_gather_collectives.cpp): where the
// ranks' descriptions differ in these alone, the report says they disagree on requires_grad.
constexpr const char* kRequiringGradText = ", requiring grad (its backward is a collective)";
constexpr const char* kNotRequiringGradText = ", not requiring grad";

struct Signature {
  CallKind kind = CallKind::Allreduce;
  std::int64_t op = -1;     // ReduceOp (or one of the k...SignatureOp), or -1 if none
  std::int64_t root = -1;   // root rank, or -1
  std::int64_t dtype = -1;  // c10::ScalarType, or -1
  std::int64_t numel = 0;   // elements (or bytes, or tensors: whatever the call compares)
  std::int64_t detail = 0;  // a hash of shapes / plan; compared, never interpreted
  ErrorClass error = ErrorClass::None;
  // Travel in the same allreduce but never raise: agree() returns true when `soft` is equal
  // on every rank and `soft_flag` is 0 on every rank (a caller's "can we take the fast path").
  std::int64_t soft = 0;
  std::int64_t soft_flag = 0;
  // A vote that travels too and never raises: set on a rank that cannot take some optional
  // route (see agree's `vetoed`). Every rank learns whether any rank set it.
  std::int64_t veto = 0;
  // Compared only when some rank has joined (a call the active ranks disagree on is No).
  Joinable joinable = Joinable::No;
  // The bytes this call's data would take in its agreement's message (ops/carried.h), 0 where
  // it never rides there. Never raises: where every rank gives the same, the group's next
  // agreement makes room for that many.
  std::int64_t carry_bytes = 0;
};

struct Carry;  // ops/carried.h

// `what` names the call for messages ("allreduce_()") when no user call is named
// (runtime/user_call.h); a named one takes its place. `text` is this rank's error
// message when sig.error != None, else a short description of its argument (shape, name)
// that is shown only if the ranks disagree. Must run where collectives may run (inline on
// the engine or on the engine thread). With one rank it only raises a local error.
// Returns whether the soft fields agree (see Signature). With `vetoed`, it is told whether
// any rank set sig.veto (false with one rank).
// Ranks that have joined (ops/join.h) take part in the same allreduce with neutral values and
// a mark, so that their presence costs the others nothing until it matters: then a call that
// is not sig.joinable raises on every rank, and `joined` (required when sig.joinable) is told
// that the joined ranks take part: an Allreduce must then call share_with_joined.
bool agree(const Signature& sig, const std::string& what, const std::string& text,
           bool* vetoed = nullptr, bool* joined = nullptr);

// The same, but the description is made only when the ranks disagree (formatting a shape on
// every call costs more than the check itself). `error_text` is used when sig.error != None.
// With `carry`, the call's data rides in the agreement's message where the group's room lets it
// (carry->carried says whether it did; ops/carried.h).
bool agree(const Signature& sig, const std::string& what, const std::string& error_text,
           const std::function<std::string()>& describe, bool* vetoed = nullptr,
           bool* joined = nullptr, Carry* carry = nullptr);

// A joined rank's part in the active ranks' next agreement on the current group (the world,
// or a process set it is in: ops/join.h), and what they agreed on.
// `rigid`: this rank's join answers rounds only (fluxmpi_py.Join), so an Allreduce raises.
// Where the active ranks raise (their call is not joinable, or bad), this rank raises the
// same RaisedOnEveryRank.
struct JoinedView {
  bool all_joined = false;  // no rank is active: every rank is in agree_as_joined
  Signature sig;            // the active ranks' signature (kind, op, dtype, numel, soft ...)
  bool soft_same = true;    // `soft` is equal on every active rank
};
JoinedView agree_as_joined(bool rigid);

// What a joinable Allreduce moves, after agree told it that ranks have joined: one entry per
// backend allreduce, in order, on `device`. Every active rank passes the same (they agreed on
// the signature); a joined rank passes nothing and gets it back.
struct AllreduceParts {
  struct Part {
    c10::ScalarType dtype;
    std::int64_t numel;
    // One dtype's tensors of a grouped allreduce, several of them: the backend may reduce
    // them where they lie (Backend::allreduce_pieces), and the joined rank must take the
    // same path (grouped_allreduce_zeros).
    bool list = false;
  };
  c10::DeviceType device = c10::DeviceType::CPU;
  std::vector<Part> parts;
};
void share_with_joined(AllreduceParts& parts, bool is_joined);

// How many world agreements this process took part in (joined or not): a clock that reads
// the same on every rank at the same point of the program.
std::int64_t world_agreements();

// Sets s.root to `root` and, unless `s` carries an error already, a ValueError (text in `msg`)
// when `root` is not a rank of env().
void check_root(std::int64_t root, Signature& s, std::string& msg);

// "torch.float32" for c10::kFloat: dtype names as Python users write them.
std::string dtype_name(c10::ScalarType t);

// Raise on this rank alone (for code paths where all ranks already agree the call is bad).
[[noreturn]] void raise_error(ErrorClass cls, const std::string& msg);

// Raise a RaisedOnEveryRank (below): only where every rank raises the same error together.
[[noreturn]] void raise_on_every_rank(ErrorClass cls, const std::string& msg);

// An error that every rank raises together, with the same message (agree's verdicts). Python
// sees a ValueError / TypeError / RuntimeError whose `raised_on_every_rank` is True, so that
// one rank reports it for all (python/module.cpp, fluxmpi_py/_excepthooks.py).
class RaisedOnEveryRank : public std::runtime_error {
 public:
  RaisedOnEveryRank(ErrorClass cls, const std::string& msg) : std::runtime_error(msg), cls_(cls) {}
  ErrorClass error_class() const { return cls_; }

 private:
  ErrorClass cls_;
};

}  // namespace fluxmpi
