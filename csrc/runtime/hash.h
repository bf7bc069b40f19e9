// The one byte hash of the C++ core, in the bottom layer so that every layer may use it: the
// planners hash shapes and options, the agreement compares the results across ranks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

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

// A 63-bit hash of `n` bytes for bulk data (tensor contents): 32 bytes per round in four
// independent multiply-rotate lanes, so the multiplies overlap; several GB/s where hash_bytes,
// one byte per multiply, does well under 1. Equal on every rank and every run (for
// check_consistency); the tail shorter than 32 bytes goes through hash_bytes.
inline std::int64_t hash_bulk(const void* data, std::size_t n, std::int64_t seed = 0) {
  constexpr std::uint64_t k1 = 0x9E3779B185EBCA87ull, k2 = 0xC2B2AE3D27D4EB4Full;
  auto rotl = [](std::uint64_t x, int r) { return (x << r) | (x >> (64 - r)); };
  auto round = [&](std::uint64_t acc, std::uint64_t w) { return rotl(acc + w * k2, 31) * k1; };
  auto* p = static_cast<const unsigned char*>(data);
  const auto s = static_cast<std::uint64_t>(seed);
  std::uint64_t a = s + k1 + k2, b = s + k2, c = s, d = s - k1;
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    std::uint64_t w[4];
    std::memcpy(w, p + i, sizeof w);
    a = round(a, w[0]);
    b = round(b, w[1]);
    c = round(c, w[2]);
    d = round(d, w[3]);
  }
  std::uint64_t h = rotl(a, 1) + rotl(b, 7) + rotl(c, 12) + rotl(d, 18) + n;
  h = static_cast<std::uint64_t>(hash_bytes(p + i, n - i, static_cast<std::int64_t>(h)));
  h ^= h >> 33;  // mix the lanes' bits into every output bit
  h *= k2;
  h ^= h >> 29;
  return static_cast<std::int64_t>(h >> 1);
}

}  // namespace fluxmpi
