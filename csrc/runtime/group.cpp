#include "runtime/group.h"

#include <c10/util/Exception.h>

#include <utility>

#include "runtime/engine.h"
#include "runtime/environment.h"
#include "runtime/world_change.h"

namespace fluxmpi {
namespace {

thread_local std::shared_ptr<const Group> t_current;
Backend& (*g_world_backend)() = nullptr;

// Engine work runs in the group that was current where it was submitted.
std::function<void()> in_submitters_group(std::function<void()> fn) {
  if (!t_current) return fn;
  return [g = t_current, inner = std::move(fn)] {
    GroupScope in_group(g);
    inner();
  };
}
const bool kSubmitContextSet = (set_submit_context(&in_submitters_group), true);

std::string ranks_text(const std::vector<int>& rs) {
  std::string out = "[";
  for (std::size_t i = 0; i < rs.size(); ++i) out += (i ? ", " : "") + std::to_string(rs[i]);
  return out + "]";
}

}  // namespace

Group::Group(int index, std::vector<int> world_ranks, int rank, MPI_Comm comm,
             std::shared_ptr<Backend> backend)
    : index_(index),
      world_ranks_(std::move(world_ranks)),
      rank_(rank),
      comm_(comm),
      backend_(std::move(backend)),
      made_in_world_(world_changes()) {}

void set_world_backend(Backend& (*world_backend)()) { g_world_backend = world_backend; }

// The communicator is not freed: MPI_Comm_free is collective-like on some MPI libraries and a
// Group may be dropped on one rank only; MPI_Finalize frees it.
Group::~Group() = default;

const std::vector<int>& Group::world_ranks() const {
  if (index_ == 0) {
    static thread_local std::vector<int> all;
    const int n = env().size;
    if (static_cast<int>(all.size()) != n) {
      all.resize(n);
      for (int r = 0; r < n; ++r) all[r] = r;
    }
    return all;
  }
  return world_ranks_;
}

int Group::rank() const { return index_ == 0 ? env().rank : rank_; }

int Group::size() const { return index_ == 0 ? env().size : static_cast<int>(world_ranks_.size()); }

MPI_Comm Group::comm() const { return index_ == 0 ? env().comm : comm_; }

Backend& Group::backend() const {
  if (index_ == 0) {
    TORCH_INTERNAL_ASSERT(g_world_backend != nullptr, "fluxmpi_py: no world backend registered");
    return g_world_backend();
  }
  check_member("a collective");
  TORCH_INTERNAL_ASSERT(backend_ != nullptr, "fluxmpi_py: group ", describe(), " has no backend");
  return *backend_;
}

std::string Group::describe() const {
  return index_ == 0 ? std::string("world") : ranks_text(world_ranks_);
}

void Group::check_fresh() const {
  if (index_ == 0 || made_in_world_ == world_changes()) return;
  TORCH_CHECK(false, "fluxmpi_py: the group of ranks ", describe(),
              " was made before ranks were lost and the world shrank (fluxmpi_py.recover()): its "
              "ranks and communicator are the old world's. Make it again after the recovery "
              "(fluxmpi_py.new_group(ranks) in the new world's numbering, e.g. in elastic_step's "
              "on_recover) and use the new one");
}

void Group::check_member(const std::string& call) const {
  check_fresh();
  if (index_ == 0 || rank_ >= 0) return;
  TORCH_CHECK_VALUE(false, call, ": rank ", env().rank, " is not a member of the group of ranks ",
                    describe(), "; only its members may call with group=");
}

const std::shared_ptr<const Group>& world_group() {
  env();  // "call Init first"
  static const auto* world = new std::shared_ptr<const Group>(
      std::make_shared<Group>(0, std::vector<int>{}, 0, MPI_COMM_NULL, nullptr));
  return *world;
}

const std::shared_ptr<const Group>& current_group_ptr() {
  return t_current ? t_current : world_group();
}

const std::shared_ptr<const Group>& scoped_group() { return t_current; }

const Group& current_group() { return *current_group_ptr(); }

GroupScope::GroupScope(std::shared_ptr<const Group> g) {
  if (!g) return;
  g->check_fresh();
  previous_ = std::exchange(t_current, std::move(g));
  set_ = true;
}

GroupScope::~GroupScope() {
  if (set_) t_current = std::move(previous_);
}

std::shared_ptr<const Group> exchange_current_group(std::shared_ptr<const Group> g) {
  return std::exchange(t_current, std::move(g));
}

}  // namespace fluxmpi
