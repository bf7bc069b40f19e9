// The general bytes broadcast: the root's bytes (synchronize_'s pickled skeleton, a parameter
// list to compare, a checkpoint) reach every rank, after an agreement that raises any rank's
// local error on every rank. Also the agreement stages that synchronize_ shares with it.
#pragma once

#include <cstdint>
#include <string>

#include "ops/consensus.h"

namespace fluxmpi {

// The name under which synchronize_'s stages (and this broadcast) report disagreements.
inline constexpr const char* kSyncWhat = "synchronize_()";

// Stages of synchronize_ that agree under kind ObjectBroadcast, told apart by `detail`, so a
// rank that is one stage ahead of another is reported instead of mismatching buffers.
enum class ObjectStage : std::int64_t { Begin = 1, Skeleton = 2 };

// Signature of one ObjectBroadcast stage, with the root checked and this rank's error `err`
// folded in; `msg` holds its text (or gets the root's).
Signature object_signature(ObjectStage stage, std::int64_t root, ErrorClass err, std::string& msg);

// Agree (stage Skeleton; this rank's error `err`, text `err_text`, raises on every rank), then
// broadcast the length and then the `len` bytes at `data` from the root. Returns the root's
// bytes on the other ranks and an empty string on the root (it keeps its own). `data` is read
// on the root only. Must run inline on the engine or on its thread.
std::string broadcast_bytes(const char* data, std::int64_t len, std::int64_t root, ErrorClass err,
                            const std::string& err_text);

}  // namespace fluxmpi
