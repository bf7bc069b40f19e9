// Shard and permutation math for DistributedDataContainer and DistributedSampler. Pure
// functions of plain integers: no MPI, no tensors, no state, so the Python objects that use
// them keep only integers and pickle trivially (DataLoader workers).
//
// An epoch's order is a sequence of n global indices: 0..n-1 without shuffle, or a keyed
// permutation of them with shuffle. Rank r takes a contiguous range of positions in that
// order; position q maps to index order((start + q) mod n) (only `Pad` ever wraps).
#pragma once

#include <cstdint>
#include <string>

namespace fluxmpi {

enum class ShardMode {
  Pad,       // every rank ceil(n/p) positions; the last ranks wrap around to the start
  DropLast,  // every rank floor(n/p) positions; the last n mod p positions are skipped
  Even,      // each position exactly once; ranks r < n mod p take one more
};

// Parses "pad" / "drop_last" / "even"; a ValueError naming `mode` otherwise.
ShardMode parse_shard_mode(const std::string& mode);

// Largest supported dataset length: positions stay far from overflow in uint64 arithmetic.
inline constexpr std::int64_t kMaxShardLength = std::int64_t{1} << 62;

// A rank's range of positions in the epoch's order. 0 <= start; positions taken mod n.
struct ShardRange {
  std::int64_t start = 0;
  std::int64_t length = 0;
};

// Validates n, world, rank (ValueError naming the argument) and returns rank's range.
ShardRange shard_range(std::int64_t n, std::int64_t world, std::int64_t rank, ShardMode mode);

// A keyed bijection on [0, n) evaluated per index in O(1) memory: a Feistel network over the
// mixed-radix domain Z_a x Z_b (a = ceil(sqrt n), b = ceil(n/a), so n <= a*b < n + a), with
// cycle-walking back into [0, n). Rounds add a keyed hash modulo a or b, so each is a
// bijection; since a*b - n < sqrt(n)+1, walks are rare (unlike a power-of-two domain, which
// can need two encryptions per index). The round keys come from (seed, epoch) through
// splitmix64, so every rank derives the same permutation.
class Permutation {
 public:
  Permutation(std::uint64_t n, std::uint64_t seed, std::uint64_t epoch);

  // The image of x, for 0 <= x < n.
  std::uint64_t operator()(std::uint64_t x) const;
  // The preimage of y, for 0 <= y < n (tests use it to check bijectivity at large n).
  std::uint64_t inverse(std::uint64_t y) const;
  // out[j] = (*this)(first + j) for j < count; first + count <= n. Encrypts several
  // consecutive indices side by side: one index's rounds are a serial chain of multiplies,
  // so interleaving independent indices is what keeps the CPU's multipliers busy.
  void apply_range(std::uint64_t first, std::int64_t count, std::int64_t* out) const;

  static constexpr int kRounds = 6;

 private:
  void encrypt(std::uint64_t& hi, std::uint64_t& lo) const;
  void decrypt(std::uint64_t& hi, std::uint64_t& lo) const;
  std::uint64_t walk(std::uint64_t y) const;  // encrypt y (>= n) until it lands in [0, n)

  std::uint64_t n_;
  std::uint64_t a_ = 1;  // x = hi * b + lo with hi in [0, a), lo in [0, b)
  std::uint64_t b_ = 1;
  std::uint64_t keys_[kRounds] = {};
};

// out[i] = the preimage of values[i] under the (seed, epoch) permutation of [0, n), for
// i < count (tests check bijectivity at large n with it). ValueError naming n when it is
// outside [0, 2**62], or naming values[i] when it is outside [0, n).
void permutation_inverse(std::int64_t n, std::uint64_t seed, std::uint64_t epoch,
                         const std::int64_t* values, std::int64_t count, std::int64_t* out);

// Everything that fixes one rank's sequence of global indices in one epoch.
struct ShardSpec {
  std::int64_t n = 0;
  std::int64_t world = 1;
  std::int64_t rank = 0;
  ShardMode mode = ShardMode::Pad;
  bool shuffle = false;
  std::uint64_t seed = 0;
  std::uint64_t epoch = 0;
};

// The rank's sequence, positions [first, first + count) of its shard, written to out[0..count).
// ValueError when the positions fall outside [0, shard length).
class ShardIndexer {
 public:
  explicit ShardIndexer(const ShardSpec& spec);

  std::int64_t at(std::int64_t position) const;
  void fill(std::int64_t first, std::int64_t count, std::int64_t* out) const;
  // ValueError unless 0 <= first <= first + count <= the shard's length.
  void check_positions(std::int64_t first, std::int64_t count) const;

 private:
  ShardSpec spec_;
  ShardRange range_;
  Permutation perm_;
};

}  // namespace fluxmpi
