// The shrink mode (fluxmpi_py.Init(on_failure="shrink")): a lost rank costs a step, not the
// job. It needs ULFM (Open MPI 5's MPIX_Comm_revoke / shrink / agree, `mpiexec --with-ft ulfm`),
// under which a collective that a lost rank can never finish returns an error on the survivors
// instead of ending the job. The first survivor to see it revokes the world, so that every
// other survivor's pending call returns too (a revoked communicator fails every call on it);
// the error reaches Python as RanksLostError. The survivors then shrink the world to
// themselves, confirm the new world by an agreement (retried: a shrink can meet a further
// loss), and adopt it as the world (environment.cpp: ranks, node ranks, host names, the
// watch and the stall protocol restarted on the new control communicator). What depends on
// the world's communicator by key (the node layout, the shared-memory windows: attributes of
// the communicator) is made anew on first use; groups made on the old world raise when used
// (Group::check_fresh).
#pragma once

#include <mpi.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace fluxmpi {

// "" when this process can run the shrink mode: the MPI library has ULFM and the job was
// started with it on (Open MPI's mpi_ft_enable); else why not, and how to get one.
std::string shrink_mode_unavailable();

// Whether MPI return code `rc` says that a rank of the communicator failed, or that the
// communicator was revoked after one did. Always false without ULFM.
bool is_rank_loss(int rc);

// The error of a call that met a lost rank (Python: fluxmpi_py.RanksLostError).
class RanksLost : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// On (after Init, where shrink_mode_unavailable() is "") or off. While on, the world's control
// communicator returns errors instead of ending the process, and a call that meets a loss
// revokes the world and throws RanksLost.
void set_shrink_mode(bool on);
bool shrink_mode();

// Throws RanksLost naming `what` and MPI's text for `rc`, after revoking the world so that
// every survivor's call ends too. Only for is_rank_loss(rc) in the shrink mode.
[[noreturn]] void throw_rank_loss(int rc, const char* what);

// The AND of `ok` over the world's live ranks, the same on every survivor (MPIX_Comm_agree is
// itself fault tolerant). Throws RanksLost when a rank of the world was lost, on every
// survivor alike; a world of one, or the mode off, returns `ok`.
bool agree_on_world(bool ok);

// What a recovery did: the old world's ranks that were lost (ascending), the sizes, the
// shrinks it took, and its seconds.
struct Recovery {
  std::vector<int> lost;
  int old_rank = 0;
  int old_size = 1;
  int rank = 0;
  int size = 1;
  int attempts = 0;
  double seconds = 0;
  // Non-empty when this side may not go on (quorum_refusal): the world was not adopted, and
  // the caller ends this process after saying why (fluxmpi_py.recover()).
  std::string refused;
};

// Split brain: a cut network looks like death to both sides, and each side shrinks to itself.
// Only one may go on: a strict majority of the world before the loss, or exactly half when it
// holds that world's rank 0 (its lowest rank; where rank 0 itself was lost, no half goes on).
// "" when the survivors of a world of `old_size` that lost the ranks `lost` (ascending, old
// numbering) may go on; else why not, in words for every rank of that side.
std::string quorum_refusal(int old_size, const std::vector<int>& lost);

// On every survivor, after RanksLost: revoke, shrink, agree (repeated until an agreement on
// the new world succeeds), and adopt the new world, when quorum_refusal allows it (else
// Recovery::refused says why, and the world is left as it was). Collective over the survivors.
Recovery shrink_world();

// How many recoveries this process has lived through.
int recoveries();

}  // namespace fluxmpi
