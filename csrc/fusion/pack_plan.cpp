#include "fusion/pack_plan.h"

#include <c10/util/Exception.h>

#include <sstream>

namespace fluxmpi {

namespace {

bool castable_float(c10::ScalarType t) {
  return t == c10::kDouble || t == c10::kFloat || t == c10::kHalf || t == c10::kBFloat16;
}

}  // namespace

bool packable(c10::ScalarType from, c10::ScalarType to, double scale) {
  if (from == to && scale == 1.0) return true;
  return castable_float(from) && castable_float(to);
}

PackPlan plan_pack(const std::vector<PackSource>& sources, c10::ScalarType wire, std::int64_t align,
                   double unscale) {
  TORCH_CHECK_VALUE(align >= 1, "pack plan: align must be at least 1 element, got ", align);
  PackPlan plan;
  plan.wire = wire;
  for (std::size_t i = 0; i < sources.size(); ++i) {
    const auto& s = sources[i];
    TORCH_CHECK_VALUE(s.numel >= 0, "pack plan: member ", i, " has a negative length ", s.numel);
    // Unpack runs the cast backwards, so both directions must be supported.
    TORCH_CHECK_VALUE(packable(s.dtype, wire, s.scale) && packable(wire, s.dtype, unscale),
                      "pack plan: member ", i, " (", dtype_short_name(s.dtype),
                      ") cannot be packed into a buffer of ", dtype_short_name(wire),
                      " with scale ", s.scale, " and unscale ", unscale,
                      ": scaling or casting needs float64, float32, float16 or bfloat16");
    if (s.numel == 0) continue;
    const std::int64_t offset = (plan.numel + align - 1) / align * align;
    plan.entries.push_back(
        {static_cast<std::int64_t>(i), offset, s.numel, s.dtype, s.scale, unscale});
    plan.numel = offset + s.numel;
  }
  return plan;
}

std::string describe(const PackPlan& plan) {
  std::ostringstream out;
  for (const auto& e : plan.entries) {
    out << "member " << e.member << ": " << dtype_short_name(e.dtype) << " x " << e.numel << " at "
        << e.offset << " (scale " << e.scale << ", unscale " << e.unscale << ")\n";
  }
  return out.str();
}

}  // namespace fluxmpi
