// The one byte hash of the C++ core, in the bottom layer so that every layer may use it: the
// planners hash shapes and options, the agreement compares the results across ranks.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fluxmpi {

// A 63-bit FNV-1a hash of `n` bytes at `data`, equal on every rank and every run, never
// negative (for Signature::detail).
inline std::int64_t hash_bytes(const void* data, std::size_t n, std::int64_t seed = 0) {
  std::uint64_t h = 1469598103934665603ull ^ static_cast<std::uint64_t>(seed);
  auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return static_cast<std::int64_t>(h >> 1);
}

}  // namespace fluxmpi
