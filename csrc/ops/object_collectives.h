// The bytes of broadcast_object and allgather_object (pickles made by the Python side): one
// agreement, then the sizes, then the bytes, over MPI whatever devices the ranks use.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fluxmpi {

// The root's `data` on every rank: returned on the other ranks; the root gets "" (it keeps its
// own). `local_error`, when not empty, is a ValueError found by the caller (an object that
// does not pickle), raised on every rank. Must run inline on the engine or on its thread.
std::string broadcast_object_bytes(const std::string& data, std::int64_t root,
                                   const std::string& local_error = {});

// Every rank's `data`, in rank order. Same rules.
std::vector<std::string> allgather_object_bytes(const std::string& data,
                                                const std::string& local_error = {});

}  // namespace fluxmpi
