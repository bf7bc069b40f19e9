#include "backend/mpi_direct_slots.h"

#include <fcntl.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>

#include "backend/mpi_check.h"

namespace fluxmpi {

namespace {

constexpr std::size_t kMapBytes = 2 * static_cast<std::size_t>(kDirectSlotBytes);
constexpr int kNameBytes = 64;

void unmap(DirectSlots& s) {
  for (char* p : s.base) {
    if (p != nullptr) ::munmap(p, kMapBytes);
  }
  s.base.clear();
  s.mapped = false;
}

// Cached on the communicator as an attribute, so that the mappings go with it and a later
// communicator never finds stale ones.
int free_slots(MPI_Comm, int, void* attr, void*) {
  std::unique_ptr<DirectSlots> s(static_cast<DirectSlots*>(attr));
  unmap(*s);
  return MPI_SUCCESS;
}

int slots_key() {
  static const int key = [] {
    int k = MPI_KEYVAL_INVALID;
    mpi_check(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &free_slots, &k, nullptr),
              "MPI_Comm_create_keyval (direct slots)");
    return k;
  }();
  return key;
}

// A mapping of the shared-memory object `name`, created (and sized) when `create`; nullptr
// where it fails.
char* map_object(const char* name, bool create) {
  const int fd =
      create ? ::shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600) : ::shm_open(name, O_RDWR, 0600);
  if (fd < 0) return nullptr;
  void* p = MAP_FAILED;
  // Its pages reserved now (posix_fallocate, not ftruncate): a full /dev/shm (a container's
  // 64 MiB) refuses here, and every rank falls back to messages, instead of a SIGBUS at the first
  // write into a page the file system cannot give.
  if (!create || ::posix_fallocate(fd, 0, static_cast<off_t>(kMapBytes)) == 0) {
    p = ::mmap(nullptr, kMapBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  ::close(fd);
  return p == MAP_FAILED ? nullptr : static_cast<char*>(p);
}

std::atomic<std::int64_t> g_slot_writes{0};

}  // namespace

void write_slot(char* dst, const void* src, std::int64_t bytes) {
  const auto* from = static_cast<const char*>(src);
  std::int64_t done = 0;
#if defined(__x86_64__)
  for (; done + 16 <= bytes; done += 16) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + done),
                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + done)));
  }
  _mm_sfence();  // the streaming stores are ordered before the header that announces them
#endif
  std::memcpy(dst + done, from + done, static_cast<std::size_t>(bytes - done));
  std::atomic_thread_fence(std::memory_order_release);
}

void note_slot_write() { g_slot_writes.fetch_add(1, std::memory_order_relaxed); }
std::int64_t direct_slot_writes() { return g_slot_writes.load(std::memory_order_relaxed); }

DirectSlots* direct_slots(MPI_Comm comm) {
  // The last communicator this thread found slots on, kept (no attribute lookup per call: 0.06-
  // 0.11 µs of a call's fixed cost). Communicators are never freed while the process runs
  // (runtime/group.h, runtime/world_change.h), so a handle never names another later.
  thread_local MPI_Comm t_comm = MPI_COMM_NULL;
  thread_local DirectSlots* t_slots = nullptr;
  if (comm == t_comm) return t_slots;
  void* attr = nullptr;
  int found = 0;
  mpi_check(MPI_Comm_get_attr(comm, slots_key(), &attr, &found), "MPI_Comm_get_attr");
  if (!found) return nullptr;
  t_comm = comm;
  t_slots = static_cast<DirectSlots*>(attr);
  return t_slots;
}

// Each rank makes a shared-memory object of its own two slots, the ranks trade the objects'
// names and map each other's, and once every rank has mapped them (a barrier) each removes its
// name: the memory lives as long as the mappings, and nothing is left behind in /dev/shm
// whatever happens to the job later. Where any rank fails at any step, every rank unmaps and
// shares nothing (the minimum of the ranks' outcomes). Not MPI_Win_allocate_shared: its
// one-sided component selection prints an error of the UCX component on hosts without UCX
// devices (Open MPI 5.0.11 from PyPI), from a call that may be the job's first bcast_.
DirectSlots& make_direct_slots(MPI_Comm comm, int size, bool one_host) {
  auto s = std::make_unique<DirectSlots>();
  if (one_host) {
    static std::atomic<int> made{0};
    int rank = 0;
    mpi_check(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
    char mine[kNameBytes] = {};
    // The process id, and a clock reading against another container's process of the same id
    // that shares /dev/shm (a name taken fails O_EXCL: then nothing is shared).
    const auto stamp = std::chrono::steady_clock::now().time_since_epoch().count();
    std::snprintf(mine, sizeof mine, "/fluxmpi-slots-%ld-%d-%llx", static_cast<long>(::getpid()),
                  made.fetch_add(1), static_cast<unsigned long long>(stamp));
    s->base.assign(static_cast<std::size_t>(size), nullptr);
    s->base[rank] = map_object(mine, /*create=*/true);
    std::vector<char> names(static_cast<std::size_t>(kNameBytes) * size);
    mpi_check(MPI_Allgather(mine, kNameBytes, MPI_CHAR, names.data(), kNameBytes, MPI_CHAR, comm),
              "MPI_Allgather (direct slots)");
    int ok = s->base[rank] != nullptr ? 1 : 0;
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      s->base[r] = map_object(names.data() + static_cast<std::size_t>(kNameBytes) * r, false);
      ok = ok && s->base[r] != nullptr;
    }
    int all_ok = 0;
    mpi_check(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm),
              "MPI_Allreduce (direct slots)");
    ::shm_unlink(mine);  // every rank has tried to map it: the name is no longer needed
    s->mapped = all_ok == 1;
    if (!s->mapped) unmap(*s);
  }
  mpi_check(MPI_Comm_set_attr(comm, slots_key(), s.get()), "MPI_Comm_set_attr");
  return *s.release();
}

}  // namespace fluxmpi
