#include "ops/exact_sum.h"

#include <ATen/Dispatch.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace fluxmpi {

namespace {

using I64 = std::int64_t;

// Blocks of elements: a block's largest |x| is found first (the block then sits in L1), then it
// is quantized on the fast path or, rarely, on the exact scalar one.
constexpr I64 kBlock = 2048;
constexpr double kMagic = 0x1.8p52;  // v + kMagic holds round(v), ties to even, in its low bits
constexpr double kFastLimit = 0x1p51;

// round(v) to nearest, ties to even, for |v| < 2**63, without the libm call that
// std::nearbyint costs here: below 2**52, adding and subtracting 2**52 (with v's sign) leaves
// the nearest integer, ties to even; from 2**52 on every double is an integer.
inline I64 round_even(double v) {
  const double big = 0x1p52;
  const double c = std::copysign(big, v);
  const double r = std::fabs(v) < big ? (v + c) - c : v;
  return static_cast<I64>(r);
}

// The type a gradient is read in (16-bit ones widen to float, exactly), and the integer of its
// width: the bits of |x| order as |x| does, and a NaN's exceed inf's.
template <typename T>
using Wide = std::conditional_t<std::is_same_v<T, double>, double, float>;
template <typename T>
using WideBits = std::conditional_t<std::is_same_v<T, double>, I64, std::int32_t>;

template <typename T>
double widen(T x) {
  return static_cast<double>(static_cast<Wide<T>>(x));
}

// acc (+)= round(x * scale) for a block whose every |x * scale| is below 2**51: v + 1.5 * 2**52
// lies in [2**52, 2**53), where the ulp is 1, so the addition rounds v to an integer (ties to
// even) and the sum's bits are those of 1.5 * 2**52 plus that integer. x * scale is exact (a
// power of two). No conversion instruction and no branch: the loop vectorizes (SSE2).
template <typename T>
void quantize_fast(const T* g, I64* acc, I64 n, double scale, bool accumulate) {
  const I64 magic = std::bit_cast<I64>(kMagic);
  if (accumulate) {
    for (I64 j = 0; j < n; ++j) acc[j] += std::bit_cast<I64>(widen(g[j]) * scale + kMagic) - magic;
  } else {
    for (I64 j = 0; j < n; ++j) acc[j] = std::bit_cast<I64>(widen(g[j]) * scale + kMagic) - magic;
  }
}

// The same for any block: elements at or beyond `bound` (or not finite) add 0.
template <typename T>
void quantize_exact(const T* g, I64* acc, I64 n, double scale, double bound, bool accumulate) {
  for (I64 j = 0; j < n; ++j) {
    const double x = widen(g[j]);
    const I64 q = std::fabs(x) < bound ? round_even(x * scale) : 0;
    acc[j] = accumulate ? acc[j] + q : q;
  }
}

// The bits of the largest |x| of g[0..m) (the largest bits for a NaN).
template <typename T>
[[gnu::always_inline]] inline WideBits<T> block_max_bits(const T* g, I64 m) {
  using B = WideBits<T>;
  B block = 0;
  for (I64 j = 0; j < m; ++j) {
    const B b = std::bit_cast<B>(static_cast<Wide<T>>(g[j])) & std::numeric_limits<B>::max();
    block = b > block ? b : block;
  }
  return block;
}

// acc[0..m) (+)= the quantized g[0..m), one block: its largest |x| chooses the fast path or
// the exact one (both give the same integers where the fast one applies). Returns the block's
// largest-|x| bits.
template <typename T>
WideBits<T> quantize_block(const T* g, I64* acc, I64 m, double scale, double bound,
                           bool accumulate) {
  const WideBits<T> block = block_max_bits(g, m);
  const double a = static_cast<double>(std::bit_cast<Wide<T>>(block));  // NaN for a NaN
  if (a < bound && a * scale < kFastLimit) {
    quantize_fast(g, acc, m, scale, accumulate);
  } else {
    quantize_exact(g, acc, m, scale, bound, accumulate);
  }
  return block;
}

template <typename T>
double quantize(const T* g, I64* acc, I64 n, double scale, double bound, bool accumulate) {
  WideBits<T> most = 0;
  for (I64 at = 0; at < n; at += kBlock) {
    const auto block =
        quantize_block(g + at, acc + at, std::min(kBlock, n - at), scale, bound, accumulate);
    most = block > most ? block : most;
  }
  return static_cast<double>(std::bit_cast<Wide<T>>(most));
}

// o = T(double(s) / divisor), with double(s) rounded once, as the conversion instruction
// rounds it, from two exact parts: the high 32 bits (signed) times 2**32, plus the low 32
// bits read through 2**52's mantissa. Vectorizes (SSE2), where an int64 -> double conversion
// does not.
template <typename T, bool kMultiply>
void dequantize(const I64* s, T* o, I64 n, double divisor) {
  const I64 two52 = std::bit_cast<I64>(0x1p52);
  const double inverse = 1.0 / divisor;
  for (I64 j = 0; j < n; ++j) {
    const double hi = static_cast<double>(static_cast<std::int32_t>(s[j] >> 32));
    const double lo = std::bit_cast<double>(two52 | (s[j] & 0xffffffffLL)) - 0x1p52;
    const double x = hi * 0x1p32 + lo;
    o[j] = static_cast<T>(kMultiply ? x * inverse : x / divisor);
  }
}

// The owner's float64 pass over one block, where it is exact: every row's |x * scale| below
// 2**51 (the magic rounding applies) and the rows' sum of those below 2**52 (each partial sum
// an integer that a double holds). A float64 sum of integers that a double holds exactly is
// the same integer whatever the order, so the result has the int64 path's bits; no int64
// array, no conversion back. Inlined into a default and an AVX2 clone (chosen at run time).
template <typename T, bool kMultiply>
[[gnu::always_inline]] inline void sum_block_f64(const T* const* rows, I64 count, I64 at, T* out,
                                                 I64 m, double scale, double divisor) {
  alignas(64) double acc[kBlock];
  const T* g = rows[0] + at;
  for (I64 j = 0; j < m; ++j) acc[j] = (widen(g[j]) * scale + kMagic) - kMagic;
  for (I64 r = 1; r < count; ++r) {
    g = rows[r] + at;
    for (I64 j = 0; j < m; ++j) acc[j] += (widen(g[j]) * scale + kMagic) - kMagic;
  }
  const double inverse = 1.0 / divisor;
  for (I64 j = 0; j < m; ++j)
    out[j] = static_cast<T>(kMultiply ? acc[j] * inverse : acc[j] / divisor);
}

std::atomic<I64> g_f64_blocks{0};
std::atomic<I64> g_int64_blocks{0};

// One block of the owner's pass: the rows' largest |x| decides between the float64 pass and
// the int64 one (quantize each row into an int64 block, then dequantize), which give the same
// bits wherever both apply. Returns the block's largest-|x| bits. All rows of a block are
// read before its outputs are written, so out may be one of the rows.
template <typename T, bool kMultiply>
[[gnu::always_inline]] inline WideBits<T> sum_parts_block(const T* const* rows, I64 count, I64 at,
                                                          T* out, I64 m, double scale, double bound,
                                                          double divisor, bool float64) {
  WideBits<T> block = 0;
  for (I64 r = 0; r < count; ++r) {
    const auto b = block_max_bits(rows[r] + at, m);
    block = b > block ? b : block;
  }
  const double a = static_cast<double>(std::bit_cast<Wide<T>>(block)) * scale;  // NaN for a NaN
  if (float64 && a < kFastLimit && a * static_cast<double>(count) < 0x1p52 &&
      static_cast<double>(std::bit_cast<Wide<T>>(block)) < bound) {
    g_f64_blocks.fetch_add(1, std::memory_order_relaxed);
    sum_block_f64<T, kMultiply>(rows, count, at, out, m, scale, divisor);
    return block;
  }
  g_int64_blocks.fetch_add(1, std::memory_order_relaxed);
  alignas(64) I64 acc[kBlock];
  for (I64 r = 0; r < count; ++r) quantize_block(rows[r] + at, acc, m, scale, bound, r > 0);
  dequantize<T, kMultiply>(acc, out, m, divisor);
  return block;
}

// The owner's pass of the sharded sum, block by block (in L1).
template <typename T, bool kMultiply>
[[gnu::always_inline]] inline double sum_parts_body(const T* const* rows, I64 count, T* out, I64 n,
                                                    double scale, double bound, double divisor,
                                                    bool float64) {
  WideBits<T> most = 0;
  for (I64 at = 0; at < n; at += kBlock) {
    const auto block = sum_parts_block<T, kMultiply>(
        rows, count, at, out + at, std::min(kBlock, n - at), scale, bound, divisor, float64);
    most = block > most ? block : most;
  }
  return static_cast<double>(std::bit_cast<Wide<T>>(most));
}

// The same body compiled for AVX2 (4 doubles a vector instead of SSE2's 2), without FMA: a
// fused multiply-add rounds once where the plain code rounds twice, so contraction could
// change bits; "no-fma" keeps the compiler from emitting any.
template <typename T, bool kMultiply>
[[gnu::target("avx2,no-fma")]] double sum_parts_avx2(const T* const* rows, I64 count, T* out, I64 n,
                                                     double scale, double bound, double divisor,
                                                     bool float64) {
  return sum_parts_body<T, kMultiply>(rows, count, out, n, scale, bound, divisor, float64);
}

template <typename T, bool kMultiply>
double sum_parts_plain(const T* const* rows, I64 count, T* out, I64 n, double scale, double bound,
                       double divisor, bool float64) {
  return sum_parts_body<T, kMultiply>(rows, count, out, n, scale, bound, divisor, float64);
}

bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}

std::atomic<bool> g_float64_pass{true};

template <typename T, bool kMultiply>
double sum_parts(const T* const* rows, I64 count, T* out, I64 n, double scale, double bound,
                 double divisor) {
  const bool float64 = g_float64_pass.load(std::memory_order_relaxed);
  return has_avx2()
             ? sum_parts_avx2<T, kMultiply>(rows, count, out, n, scale, bound, divisor, float64)
             : sum_parts_plain<T, kMultiply>(rows, count, out, n, scale, bound, divisor, float64);
}

// Whether 1 / d is a power of two that a double holds exactly (d = 2**k, |k| <= 1021): x / d
// and x * (1 / d) are then the same exact quotient, rounded once the same way.
// A finite power of two (frexp's mantissa 0.5) within [2**lo, 2**hi]: scaling by it, or by its
// inverse when both ends keep clear of the range's edges, is exact.
bool power_of_two(double d, int lo = -1074, int hi = 1023) {
  int exponent = 0;
  return std::isfinite(d) && d > 0 && std::frexp(d, &exponent) == 0.5 && exponent - 1 <= hi &&
         exponent - 1 >= lo;
}

bool exact_inverse(double d) { return power_of_two(d, -1021, 1021); }

void check_sum(const at::Tensor& sum, const at::Tensor& other, const char* what,
               const char* other_name) {
  TORCH_CHECK_VALUE(sum.defined() && sum.device().is_cpu() && sum.scalar_type() == c10::kLong &&
                        sum.is_contiguous(),
                    what, ": the accumulator must be a contiguous CPU int64 tensor, got ",
                    sum.defined() ? sum.toString() : std::string("an undefined tensor"));
  TORCH_CHECK_VALUE(other.defined() && other.device().is_cpu() && other.is_floating_point() &&
                        !other.is_complex(),
                    what, ": ", other_name, " must be a real floating CPU tensor, got ",
                    other.defined() ? other.toString() : std::string("an undefined tensor"));
  TORCH_CHECK_VALUE(sum.numel() == other.numel(), what, ": ", other_name, " has ", other.numel(),
                    " elements but the accumulator has ", sum.numel());
}

// The ranks' rows of one shard, as pointers of the dtype being summed.
template <typename T>
std::vector<const T*> typed_rows(const std::vector<const void*>& rows) {
  std::vector<const T*> r;
  r.reserve(rows.size());
  for (const void* row : rows) r.push_back(static_cast<const T*>(row));
  return r;
}

}  // namespace

double exact_quantize(const at::Tensor& grad, const at::Tensor& acc, double scale, double bound,
                      bool accumulate) {
  check_sum(acc, grad, "exact_quantize", "the gradient");
  TORCH_CHECK_VALUE(power_of_two(scale),
                    "exact_quantize: scale must be a finite power of two, got ", scale);
  const at::Tensor g = grad.contiguous();
  double most = 0.0;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      c10::kHalf, c10::kBFloat16, g.scalar_type(), "exact_quantize", [&] {
        most = quantize(g.const_data_ptr<scalar_t>(), acc.data_ptr<std::int64_t>(), g.numel(),
                        scale, bound, accumulate);
      });
  return most;
}

void exact_dequantize(const at::Tensor& sum, const at::Tensor& out, double divisor) {
  check_sum(sum, out, "exact_dequantize", "the output");
  TORCH_CHECK_VALUE(out.is_contiguous(), "exact_dequantize: the output must be contiguous");
  const std::int64_t* s = sum.const_data_ptr<std::int64_t>();
  const std::int64_t n = sum.numel();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      c10::kHalf, c10::kBFloat16, out.scalar_type(), "exact_dequantize", [&] {
        if (exact_inverse(divisor)) {
          dequantize<scalar_t, true>(s, out.data_ptr<scalar_t>(), n, divisor);
        } else {
          dequantize<scalar_t, false>(s, out.data_ptr<scalar_t>(), n, divisor);
        }
      });
}

double exact_sum_parts(const std::vector<const void*>& rows, void* out, std::int64_t n,
                       c10::ScalarType dtype, double scale, double bound, double divisor) {
  TORCH_INTERNAL_ASSERT(!rows.empty() && n >= 0 && power_of_two(scale));
  double most = 0.0;
  AT_DISPATCH_FLOATING_TYPES_AND2(c10::kHalf, c10::kBFloat16, dtype, "exact_sum_parts", [&] {
    const auto r = typed_rows<scalar_t>(rows);
    auto* o = static_cast<scalar_t*>(out);
    const auto count = static_cast<std::int64_t>(r.size());
    most = exact_inverse(divisor)
               ? sum_parts<scalar_t, true>(r.data(), count, o, n, scale, bound, divisor)
               : sum_parts<scalar_t, false>(r.data(), count, o, n, scale, bound, divisor);
  });
  return most;
}

double exact_sum_rows(const at::Tensor& rows, const at::Tensor& out, double scale, double bound,
                      double divisor) {
  TORCH_CHECK_VALUE(rows.defined() && rows.device().is_cpu() && rows.dim() == 2 &&
                        rows.is_floating_point() && !rows.is_complex() &&
                        (rows.size(1) <= 1 || rows.stride(1) == 1),
                    "exact_sum_rows: rows must be a 2-d real floating CPU tensor whose rows are "
                    "contiguous, got ",
                    rows.defined() ? rows.toString() : std::string("an undefined tensor"));
  TORCH_CHECK_VALUE(out.defined() && out.device().is_cpu() && out.dim() == 1 &&
                        out.is_contiguous() && out.scalar_type() == rows.scalar_type(),
                    "exact_sum_rows: out must be a contiguous 1-d CPU tensor of rows' dtype (",
                    rows.scalar_type(), "), got ",
                    out.defined() ? out.toString() : std::string("an undefined tensor"));
  TORCH_CHECK_VALUE(out.numel() == rows.size(1), "exact_sum_rows: out has ", out.numel(),
                    " elements but the rows have ", rows.size(1));
  TORCH_CHECK_VALUE(rows.size(0) >= 1, "exact_sum_rows: rows must have at least one row");
  TORCH_CHECK_VALUE(power_of_two(scale),
                    "exact_sum_rows: scale must be a finite power of two, got ", scale);
  std::vector<const void*> parts;
  const auto* base = static_cast<const char*>(rows.const_data_ptr());
  const auto row_bytes = rows.stride(0) * static_cast<std::int64_t>(rows.element_size());
  for (std::int64_t r = 0; r < rows.size(0); ++r) parts.push_back(base + r * row_bytes);
  return exact_sum_parts(parts, out.data_ptr(), rows.size(1), rows.scalar_type(), scale, bound,
                         divisor);
}

bool set_exact_float64_pass(bool on) { return g_float64_pass.exchange(on); }

std::pair<std::int64_t, std::int64_t> exact_sum_block_counts() {
  return {g_f64_blocks.load(), g_int64_blocks.load()};
}

}  // namespace fluxmpi
