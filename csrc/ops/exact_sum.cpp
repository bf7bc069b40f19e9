#include "ops/exact_sum.h"

#include <ATen/Dispatch.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <cstdint>
#include <limits>

namespace fluxmpi {

namespace {

// round(v) to nearest, ties to even, for |v| < 2**63, without the libm call that
// std::nearbyint costs here: below 2**52, adding and subtracting 2**52 (with v's sign) leaves
// the nearest integer, ties to even; from 2**52 on every double is an integer.
inline std::int64_t round_even(double v) {
  const double big = 0x1p52;
  const double c = std::copysign(big, v);
  const double r = std::fabs(v) < big ? (v + c) - c : v;
  return static_cast<std::int64_t>(r);
}

template <typename T>
double quantize(const T* g, std::int64_t* acc, std::int64_t n, double scale, double bound,
                bool accumulate) {
  double most = 0.0;
  bool nan = false;
  if (accumulate) {
    for (std::int64_t j = 0; j < n; ++j) {
      const double x = static_cast<double>(g[j]);
      const double a = std::fabs(x);
      nan |= a != a;
      most = a > most ? a : most;
      acc[j] += a < bound ? round_even(x * scale) : 0;
    }
  } else {
    for (std::int64_t j = 0; j < n; ++j) {
      const double x = static_cast<double>(g[j]);
      const double a = std::fabs(x);
      nan |= a != a;
      most = a > most ? a : most;
      acc[j] = a < bound ? round_even(x * scale) : 0;
    }
  }
  return nan ? std::numeric_limits<double>::quiet_NaN() : most;
}

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
  int exponent = 0;
  TORCH_CHECK_VALUE(std::isfinite(scale) && scale > 0 && std::frexp(scale, &exponent) == 0.5,
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
        scalar_t* o = out.data_ptr<scalar_t>();
        for (std::int64_t j = 0; j < n; ++j) {
          o[j] = static_cast<scalar_t>(static_cast<double>(s[j]) / divisor);
        }
      });
}

}  // namespace fluxmpi
