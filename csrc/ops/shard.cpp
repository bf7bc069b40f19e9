// Shard ranges and the keyed permutation; see shard.h for the model.
#include "ops/shard.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>

namespace fluxmpi {
namespace {

constexpr std::uint64_t kGolden = 0x9E3779B97F4A7C15ull;

// splitmix64's finalizer: a fast bijective mixer whose every output bit depends on every
// input bit, which is what both the key schedule and the round function need.
constexpr std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Round function: a keyed pseudo-random function of one half. It need not be invertible;
// the Feistel structure makes each round a bijection whatever it returns.
inline std::uint64_t round_fn(std::uint64_t half, std::uint64_t key) { return mix64(half + key); }

// A hash mapped onto [0, m) by a multiply-high, which avoids a division (Lemire's reduction).
inline std::uint64_t reduce(std::uint64_t h, std::uint64_t m) {
  return static_cast<std::uint64_t>((static_cast<unsigned __int128>(h) * m) >> 64);
}

// x + d (mod m) and x - d (mod m) for x, d in [0, m): a compare instead of a division.
inline std::uint64_t add_mod(std::uint64_t x, std::uint64_t d, std::uint64_t m) {
  x += d;
  return x >= m ? x - m : x;
}
inline std::uint64_t sub_mod(std::uint64_t x, std::uint64_t d, std::uint64_t m) {
  return x >= d ? x - d : x + m - d;
}

// Lanes encrypted side by side in apply_range.
constexpr int kLanes = 8;

}  // namespace

ShardMode parse_shard_mode(const std::string& mode) {
  if (mode == "pad") return ShardMode::Pad;
  if (mode == "drop_last") return ShardMode::DropLast;
  if (mode == "even") return ShardMode::Even;
  TORCH_CHECK_VALUE(false, "shard mode must be one of 'pad', 'drop_last', 'even', got '", mode,
                    "'");
}

ShardRange shard_range(std::int64_t n, std::int64_t world, std::int64_t rank, ShardMode mode) {
  TORCH_CHECK_VALUE(n >= 0 && n <= kMaxShardLength, "dataset length n must be in [0, 2**62], got ",
                    n);
  TORCH_CHECK_VALUE(world >= 1 && world <= (std::int64_t{1} << 31),
                    "world_size must be in [1, 2**31], got ", world);
  TORCH_CHECK_VALUE(rank >= 0 && rank < world, "rank must be in [0, world_size=", world, "), got ",
                    rank);
  ShardRange r;
  switch (mode) {
    case ShardMode::Pad:
      // ceil(n/p) each; positions past n wrap around (mod n), as torch pads with the first
      // samples of the epoch's order. Equal lengths keep per-step collectives in lockstep.
      r.length = (n + world - 1) / world;
      r.start = rank * r.length;
      break;
    case ShardMode::DropLast:
      r.length = n / world;
      r.start = rank * r.length;
      break;
    case ShardMode::Even: {
      // Balanced split: the first n mod p ranks take one extra, so no rank is empty when
      // n >= p (FluxMPI's ceil split leaves trailing ranks empty, e.g. n=5, p=4).
      const std::int64_t q = n / world, rem = n % world;
      r.length = q + (rank < rem ? 1 : 0);
      r.start = rank * q + std::min(rank, rem);
      break;
    }
  }
  return r;
}

Permutation::Permutation(std::uint64_t n, std::uint64_t seed, std::uint64_t epoch) : n_(n) {
  if (n_ <= 1) return;
  // a = ceil(sqrt(n)) exactly (the double estimate can be one off for large n).
  std::uint64_t a = static_cast<std::uint64_t>(std::sqrt(static_cast<double>(n_)));
  while (a * a < n_) ++a;
  while (a > 1 && (a - 1) * (a - 1) >= n_) --a;
  a_ = a;
  b_ = (n_ + a_ - 1) / a_;
  // Distinct (seed, epoch) pairs give unrelated key schedules: each input passes a full mix.
  const std::uint64_t base = mix64(mix64(seed + kGolden) ^ mix64(epoch + 2 * kGolden + 1));
  for (int i = 0; i < kRounds; ++i) keys_[i] = mix64(base + (i + 1) * kGolden);
}

// Alternating rounds: hi += F(lo) mod a, then lo += F(hi) mod b. Each round only adds a
// function of the other half, so it is undone by subtracting the same value.
void Permutation::encrypt(std::uint64_t& hi, std::uint64_t& lo) const {
  for (int i = 0; i < kRounds; i += 2) {
    hi = add_mod(hi, reduce(round_fn(lo, keys_[i]), a_), a_);
    lo = add_mod(lo, reduce(round_fn(hi, keys_[i + 1]), b_), b_);
  }
}

void Permutation::decrypt(std::uint64_t& hi, std::uint64_t& lo) const {
  for (int i = kRounds - 2; i >= 0; i -= 2) {
    lo = sub_mod(lo, reduce(round_fn(hi, keys_[i + 1]), b_), b_);
    hi = sub_mod(hi, reduce(round_fn(lo, keys_[i]), a_), a_);
  }
}

std::uint64_t Permutation::walk(std::uint64_t y) const {
  // The cycle of the encryption through y returns to [0, n) (it started there), and every
  // point of [0, n) is reached from exactly one start: the walk is a bijection on [0, n).
  while (y >= n_) {
    std::uint64_t hi = y / b_, lo = y % b_;
    encrypt(hi, lo);
    y = hi * b_ + lo;
  }
  return y;
}

std::uint64_t Permutation::operator()(std::uint64_t x) const {
  if (n_ <= 1) return x;
  std::uint64_t hi = x / b_, lo = x % b_;
  encrypt(hi, lo);
  return walk(hi * b_ + lo);
}

std::uint64_t Permutation::inverse(std::uint64_t y) const {
  if (n_ <= 1) return y;
  do {
    std::uint64_t hi = y / b_, lo = y % b_;
    decrypt(hi, lo);
    y = hi * b_ + lo;
  } while (y >= n_);
  return y;
}

void Permutation::apply_range(std::uint64_t first, std::int64_t count, std::int64_t* out) const {
  if (n_ <= 1) {
    for (std::int64_t j = 0; j < count; ++j) out[j] = static_cast<std::int64_t>(first + j);
    return;
  }
  // Consecutive x: step (hi, lo) like an odometer instead of dividing per index.
  std::uint64_t hi = first / b_, lo = first % b_;
  std::int64_t j = 0;
  for (; j + kLanes <= count; j += kLanes) {
    std::uint64_t h[kLanes], l[kLanes];
    for (int w = 0; w < kLanes; ++w) {
      h[w] = hi;
      l[w] = lo;
      if (++lo == b_) lo = 0, ++hi;
    }
    for (int i = 0; i < kRounds; i += 2) {
      for (int w = 0; w < kLanes; ++w)
        h[w] = add_mod(h[w], reduce(round_fn(l[w], keys_[i]), a_), a_);
      for (int w = 0; w < kLanes; ++w)
        l[w] = add_mod(l[w], reduce(round_fn(h[w], keys_[i + 1]), b_), b_);
    }
    for (int w = 0; w < kLanes; ++w) out[j + w] = static_cast<std::int64_t>(h[w] * b_ + l[w]);
  }
  for (; j < count; ++j) {
    std::uint64_t h = hi, l = lo;
    if (++lo == b_) lo = 0, ++hi;
    encrypt(h, l);
    out[j] = static_cast<std::int64_t>(h * b_ + l);
  }
  // Rare (probability < 1/sqrt(n)): an image in [n, a*b) walks on, apart from the batch.
  for (j = 0; j < count; ++j) {
    if (static_cast<std::uint64_t>(out[j]) >= n_) out[j] = static_cast<std::int64_t>(walk(out[j]));
  }
}

static_assert(Permutation::kRounds % 2 == 0, "the rounds run in (hi, lo) pairs");

void permutation_inverse(std::int64_t n, std::uint64_t seed, std::uint64_t epoch,
                         const std::int64_t* values, std::int64_t count, std::int64_t* out) {
  TORCH_CHECK_VALUE(n >= 0 && n <= kMaxShardLength, "n must be in [0, 2**62], got ", n);
  Permutation perm(static_cast<std::uint64_t>(n), seed, epoch);
  for (std::int64_t i = 0; i < count; ++i) {
    TORCH_CHECK_VALUE(values[i] >= 0 && values[i] < n, "values[", i, "] must be in [0, n=", n,
                      "), got ", values[i]);
    out[i] = static_cast<std::int64_t>(perm.inverse(static_cast<std::uint64_t>(values[i])));
  }
}

ShardIndexer::ShardIndexer(const ShardSpec& spec)
    : spec_(spec),
      range_(shard_range(spec.n, spec.world, spec.rank, spec.mode)),
      perm_(static_cast<std::uint64_t>(spec.n), spec.seed, spec.epoch) {}

void ShardIndexer::check_positions(std::int64_t first, std::int64_t count) const {
  TORCH_CHECK_VALUE(
      first >= 0 && count >= 0 && first <= range_.length && count <= range_.length - first,
      "positions [", first, ", ", first, " + ", count, ") must lie in rank ", spec_.rank,
      "'s shard [0, ", range_.length, ")");
}

std::int64_t ShardIndexer::at(std::int64_t position) const {
  check_positions(position, 1);
  auto pos =
      static_cast<std::uint64_t>(range_.start + position) % static_cast<std::uint64_t>(spec_.n);
  return static_cast<std::int64_t>(spec_.shuffle ? perm_(pos) : pos);
}

void ShardIndexer::fill(std::int64_t first, std::int64_t count, std::int64_t* out) const {
  check_positions(first, count);
  if (count == 0) return;
  const auto n = static_cast<std::uint64_t>(spec_.n);
  // Positions run consecutively from start + first, wrapping to 0 at n (only Pad wraps):
  // fill in segments that do not wrap.
  std::uint64_t pos = static_cast<std::uint64_t>(range_.start + first) % n;
  while (count > 0) {
    const std::int64_t seg = static_cast<std::int64_t>(std::min<std::uint64_t>(count, n - pos));
    if (spec_.shuffle) {
      perm_.apply_range(pos, seg, out);
    } else {
      for (std::int64_t j = 0; j < seg; ++j) out[j] = static_cast<std::int64_t>(pos + j);
    }
    out += seg;
    count -= seg;
    pos = 0;
  }
}

}  // namespace fluxmpi
