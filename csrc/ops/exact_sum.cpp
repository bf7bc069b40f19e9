#include "ops/exact_sum.h"

#include <ATen/Dispatch.h>
#include <c10/util/Exception.h>

#include <algorithm>
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

template <typename T>
double quantize(const T* g, I64* acc, I64 n, double scale, double bound, bool accumulate) {
  using B = WideBits<T>;
  B most = 0;
  for (I64 at = 0; at < n; at += kBlock) {
    const I64 m = std::min(kBlock, n - at);
    B block = 0;
    for (I64 j = 0; j < m; ++j) {
      const B b = std::bit_cast<B>(static_cast<Wide<T>>(g[at + j])) & std::numeric_limits<B>::max();
      block = b > block ? b : block;
    }
    most = block > most ? block : most;
    const double a = static_cast<double>(std::bit_cast<Wide<T>>(block));  // NaN for a NaN
    if (a < bound && a * scale < kFastLimit) {
      quantize_fast(g + at, acc + at, m, scale, accumulate);
    } else {
      quantize_exact(g + at, acc + at, m, scale, bound, accumulate);
    }
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

}  // namespace fluxmpi
