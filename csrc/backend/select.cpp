#include "backend/select.h"

#include "backend/staged_backend.h"

#ifdef FLUXMPI_WITH_CUDA
#include <cuda_runtime_api.h>

#include "backend/nccl_backend.h"
#endif

#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <iterator>
#include <mutex>
#include <utility>

#include "runtime/group.h"

namespace fluxmpi {

namespace {

std::mutex g_refusal_mu;
std::string g_refusal;
std::atomic<bool> g_cuda_mpi_allowed{true};
std::atomic<bool> g_cuda_over_mpi{false};
std::atomic<bool> g_nccl_comm_stream{true};
std::atomic<bool> g_nccl_host_wait{false};
std::atomic<bool> g_nccl_groups{true};

}  // namespace

void set_cuda_refusal(std::string why) {
  std::lock_guard<std::mutex> lk(g_refusal_mu);
  g_refusal = std::move(why);
}

std::string cuda_refusal() {
  std::lock_guard<std::mutex> lk(g_refusal_mu);
  return g_refusal;
}

void set_cuda_mpi_allowed(bool on) { g_cuda_mpi_allowed = on; }
bool cuda_mpi_allowed() { return g_cuda_mpi_allowed; }

void set_cuda_over_mpi(bool on) { g_cuda_over_mpi = on; }
bool cuda_over_mpi() { return g_cuda_over_mpi; }

void set_nccl_comm_stream(bool on) { g_nccl_comm_stream = on; }
bool nccl_comm_stream() { return g_nccl_comm_stream; }

void set_nccl_host_wait(bool on) { g_nccl_host_wait = on; }
bool nccl_host_wait() { return g_nccl_host_wait; }

void set_nccl_groups(bool on) { g_nccl_groups = on; }
bool nccl_groups() { return g_nccl_groups; }

namespace {
// Whether a CUDA tensor of the current group goes to NCCL (else to MPI, staged).
bool cuda_on_nccl() { return !cuda_over_mpi() && (current_group().is_world() || nccl_groups()); }
}  // namespace

std::optional<c10::Stream> comm_stream_of(c10::Device device) {
#ifdef FLUXMPI_WITH_CUDA
  if (device.is_cuda() && nccl_comm_stream() && cuda_on_nccl()) {
    return nccl_comm_stream_for(device.index());
  }
#endif
  (void)device;
  return std::nullopt;
}

bool device_supported(const at::Tensor& t) {
#ifdef FLUXMPI_WITH_CUDA
  if (t.is_cuda()) return true;
#endif
  return t.is_cpu();
}

Backend& mpi_backend() { return current_group().backend(); }

Backend& backend_for(const at::Tensor& t) {
#ifdef FLUXMPI_WITH_CUDA
  if (t.is_cuda()) {
    // Ranks sharing a GPU cannot use NCCL; a group has an NCCL communicator only with
    // nccl_groups() on.
    if (!cuda_on_nccl()) return cuda_mpi_backend(t.get_device());
    return nccl_backend(t.get_device());
  }
#endif
  TORCH_CHECK(t.is_cpu(), "fluxmpi_py: tensors on ", t.device(),
              " are not supported by this build (CPU and, when built with CUDA, CUDA)");
  return stage_host() ? staged_host_backend() : mpi_backend();
}

bool compiled_with_cuda() {
#ifdef FLUXMPI_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int abort_nccl_comms_for_test() {
#ifdef FLUXMPI_WITH_CUDA
  return nccl_abort_all_for_test();
#else
  return 0;
#endif
}

std::string nccl_version() {
#ifdef FLUXMPI_WITH_CUDA
  return nccl_version_string();
#else
  return "";
#endif
}

std::string cuda_schedule(const std::string& mode) {
#ifdef FLUXMPI_WITH_CUDA
  static const std::pair<const char*, unsigned> kModes[] = {
      {"auto", cudaDeviceScheduleAuto},
      {"spin", cudaDeviceScheduleSpin},
      {"yield", cudaDeviceScheduleYield},
      {"blocking", cudaDeviceScheduleBlockingSync},
  };
  int device = -1;
  cudaError_t rc = cudaGetDevice(&device);
  TORCH_CHECK(rc == cudaSuccess, "fluxmpi_py: cudaGetDevice: ", cudaGetErrorString(rc));
  unsigned flags = 0;
  rc = cudaGetDeviceFlags(&flags);
  TORCH_CHECK(rc == cudaSuccess, "fluxmpi_py: cudaGetDeviceFlags on cuda:", device, ": ",
              cudaGetErrorString(rc));
  if (!mode.empty()) {
    const auto* chosen = std::find_if(std::begin(kModes), std::end(kModes),
                                      [&](const auto& m) { return mode == m.first; });
    TORCH_CHECK(chosen != std::end(kModes), "fluxmpi_py: CUDA schedule '", mode,
                "' is not one of auto, spin, yield, blocking");
    flags = (flags & ~static_cast<unsigned>(cudaDeviceScheduleMask)) | chosen->second;
    rc = cudaSetDeviceFlags(flags);
    TORCH_CHECK(rc == cudaSuccess, "fluxmpi_py: cudaSetDeviceFlags(", mode, ") on cuda:", device,
                ": ", cudaGetErrorString(rc));
    rc = cudaGetDeviceFlags(&flags);
    TORCH_CHECK(rc == cudaSuccess, "fluxmpi_py: cudaGetDeviceFlags on cuda:", device, ": ",
                cudaGetErrorString(rc));
  }
  const unsigned schedule = flags & static_cast<unsigned>(cudaDeviceScheduleMask);
  for (const auto& m : kModes) {
    if (m.second == schedule) return m.first;
  }
  return "flags " + std::to_string(schedule);
#else
  TORCH_CHECK(mode.empty(), "fluxmpi_py: a CUDA schedule ('", mode,
              "') needs a build with CUDA; this one has none");
  return "";
#endif
}

}  // namespace fluxmpi
