// Shared-memory slots for a direct agreement's data (backend/direct.h), on a communicator whose
// ranks all run on one host.
//
// Past one eager fragment a payload went as a rendezvous message: the receiver, once it had
// checked the headers, read it straight from the sender's buffer (single copy), and the sender
// waited for that read to end: a round trip and a cross-process read (about 3.4 µs for 16 KiB,
// docs/measurements.md). Through a slot, the sender copies its payload into its own slot, in
// shared memory that every rank of the communicator maps, before it sends its header, and needs to
// wait for nobody's read; a receiver whose call passed copies or combines it out after the
// headers. A bad call leaves the slot unread.
//
// Each rank owns two slots and writes them in turn. A slot is written again two writes later;
// in between its owner made a whole agreement, and so received every other rank's header of
// that agreement, which each rank sends only once it has left its previous call, the one that
// read the slot. So a slot is never overwritten while a rank may still read it, and no message
// or flag beyond the headers is needed. A header says which slot holds its payload.
#pragma once

#include <mpi.h>

#include <cstdint>

#include "backend/shm_segment.h"

namespace fluxmpi {

// The largest payload a slot holds (ops/carried.h carries no more on the direct path); larger
// ones go as rendezvous messages (single copy). Each rank maps 2 of these per rank of the group.
constexpr std::int64_t kDirectSlotBytes = std::int64_t(1) << 20;

// Each rank's part of the segment holds its two slots.
struct DirectSlots : ShmSegment {
  std::int64_t writes = 0;  // this rank's slot writes so far: the next goes to writes % 2
  bool shared() const { return mapped; }
  char* slot(int rank, std::int64_t s) const { return base[rank] + s * kDirectSlotBytes; }
};

// The slots made on `comm`, or nullptr while none were made (then nothing is shared yet).
DirectSlots* direct_slots(MPI_Comm comm);

// Make `comm`'s slots: a collective, which every rank of `comm` reaches at the same call (after
// the same passed agreement). `one_host`: whether its ranks all run on one host, the same on
// every rank; if not, the slots made share nothing and the payloads keep their messages.
// Freed with the communicator.
DirectSlots& make_direct_slots(MPI_Comm comm, bool one_host);

// Copy `bytes` of `src` into a slot `dst` (16-byte aligned) and make them visible before what
// follows: on x86-64 with streaming stores, which bypass this core's cache. Plain stores there
// took 20-30 ns a cache line whenever the slot's lines sat in a reader's cache (every call:
// the reader read them two writes before): 29 µs for 64 KiB, 2 with streaming stores, the
// reader's copy out 3.5-4 µs either way (2 ranks, docs/measurements.md).
void write_slot(char* dst, const void* src, std::int64_t bytes);

// Count a payload written into a slot; how many this process has written (for tests).
void note_slot_write();
std::int64_t direct_slot_writes();

}  // namespace fluxmpi
