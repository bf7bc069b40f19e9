#include "backend/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>

#include "backend/mpi_check.h"

namespace fluxmpi {

namespace {

constexpr int kNameBytes = 64;
constexpr int kUses = 2;

void unmap(ShmSegment& s) {
  for (char* p : s.base) {
    if (p != nullptr) ::munmap(p, static_cast<std::size_t>(s.bytes));
  }
  s.base.clear();
  s.mapped = false;
}

// A segment is an attribute of its communicator, so that the mappings go with it and a later
// communicator never finds stale ones.
int free_segment(MPI_Comm, int, void* attr, void*) {
  delete static_cast<ShmSegment*>(attr);  // made by a unique_ptr in keep_shm_segment
  return MPI_SUCCESS;
}

int segment_key(ShmUse use) {
  static const auto keys = [] {
    std::vector<int> k(kUses, MPI_KEYVAL_INVALID);
    for (int& key : k) {
      mpi_check(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &free_segment, &key, nullptr),
                "MPI_Comm_create_keyval (shared memory)");
    }
    return k;
  }();
  return keys[static_cast<int>(use)];
}

// A mapping of `bytes` of the shared-memory object `name`, created (and sized) when `create`;
// nullptr where it fails.
char* map_object(const char* name, std::int64_t bytes, bool create) {
  const int fd =
      create ? ::shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600) : ::shm_open(name, O_RDWR, 0600);
  if (fd < 0) return nullptr;
  void* p = MAP_FAILED;
  // Its pages reserved now (posix_fallocate, not ftruncate): a full /dev/shm (a container's
  // 64 MiB) refuses here, and every rank goes without, instead of a SIGBUS at the first write
  // into a page the file system cannot give.
  if (!create || ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)) == 0) {
    p = ::mmap(nullptr, static_cast<std::size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  ::close(fd);
  return p == MAP_FAILED ? nullptr : static_cast<char*>(p);
}

}  // namespace

ShmSegment::~ShmSegment() { unmap(*this); }

ShmSegment* find_shm_segment(MPI_Comm comm, ShmUse use) {
  void* attr = nullptr;
  int found = 0;
  mpi_check(MPI_Comm_get_attr(comm, segment_key(use), &attr, &found), "MPI_Comm_get_attr");
  return found ? static_cast<ShmSegment*>(attr) : nullptr;
}

// Each rank makes a shared-memory object of its own part, the ranks trade the objects' names
// and map each other's, and once every rank has tried (the allreduce that agrees on the outcome)
// each removes its name: the memory lives as long as the mappings, and nothing is left behind
// in /dev/shm whatever happens to the job later.
ShmSegment& keep_shm_segment(MPI_Comm comm, ShmUse use, std::unique_ptr<ShmSegment> s,
                             std::int64_t bytes, bool one_host) {
  s->bytes = bytes;
  if (one_host) {
    static std::atomic<int> made{0};
    int rank = 0, size = 0;
    mpi_check(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
    mpi_check(MPI_Comm_size(comm, &size), "MPI_Comm_size");
    char mine[kNameBytes] = {};
    // The process id, and a clock reading against another container's process of the same id
    // that shares /dev/shm (a name taken fails O_EXCL: then nothing is shared).
    const auto stamp = std::chrono::steady_clock::now().time_since_epoch().count();
    std::snprintf(mine, sizeof mine, "/fluxmpi-shm%d-%ld-%d-%llx", static_cast<int>(use),
                  static_cast<long>(::getpid()), made.fetch_add(1),
                  static_cast<unsigned long long>(stamp));
    s->base.assign(static_cast<std::size_t>(size), nullptr);
    s->base[rank] = map_object(mine, bytes, /*create=*/true);
    std::vector<char> names(static_cast<std::size_t>(kNameBytes) * size);
    mpi_check(MPI_Allgather(mine, kNameBytes, MPI_CHAR, names.data(), kNameBytes, MPI_CHAR, comm),
              "MPI_Allgather (shared memory)");
    int ok = s->base[rank] != nullptr ? 1 : 0;
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      s->base[r] = map_object(names.data() + static_cast<std::size_t>(kNameBytes) * r, bytes,
                              /*create=*/false);
      ok = ok && s->base[r] != nullptr;
    }
    int all_ok = 0;
    mpi_check(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm),
              "MPI_Allreduce (shared memory)");
    ::shm_unlink(mine);  // every rank has tried to map it: the name is no longer needed
    s->mapped = all_ok == 1;
    if (!s->mapped) unmap(*s);
  }
  mpi_check(MPI_Comm_set_attr(comm, segment_key(use), s.get()), "MPI_Comm_set_attr");
  return *s.release();
}

}  // namespace fluxmpi
