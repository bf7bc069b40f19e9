// The pack plan: which tensor goes to which offset of a flat buffer, with what scale and cast.
// One plan drives every implementation of pack and unpack (fusion/pack_cpu.* on the host,
// cuda/pack_kernels.* on a GPU), so what the CPU tests check is what a GPU bucket does. Pure:
// it never sees data, MPI or a device.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

namespace fluxmpi {

// One tensor to pack: its dtype and length (elements), and the factor pack multiplies it by.
struct PackSource {
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  std::int64_t numel = 0;
  double scale = 1.0;
};

// Where member `member` lives in the flat buffer: `numel` elements from element `offset` (of
// the wire dtype). Pack writes wire[offset + j] = cast<wire>(compute(src[j]) * scale); unpack
// writes dst[j] = cast<dtype>(compute(wire[offset + j]) * unscale). compute() is the source's
// math type: double for double, float for every other floating dtype (torch's opmath).
struct PackEntry {
  std::int64_t member = 0;
  std::int64_t offset = 0;
  std::int64_t numel = 0;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  double scale = 1.0;
  double unscale = 1.0;
};

struct PackPlan {
  c10::ScalarType wire = c10::ScalarType::Undefined;  // the flat buffer's dtype
  std::int64_t numel = 0;          // the flat buffer's length (elements), padding included
  std::vector<PackEntry> entries;  // in member order; empty members have none
};

// Whether pack can turn `from` into `to` with `scale`: a plain copy (same dtype, scale 1) of any
// dtype, or a scaled cast between float64, float32, float16 and bfloat16.
bool packable(c10::ScalarType from, c10::ScalarType to, double scale);

// Members at increasing offsets, each starting at a multiple of `align` elements (>= 1), in
// the given order; `unscale` is what unpack multiplies by. A ValueError names the first member
// that cannot be packed into `wire` (see packable) or has a negative length.
PackPlan plan_pack(const std::vector<PackSource>& sources, c10::ScalarType wire,
                   std::int64_t align = 1, double unscale = 1.0);

// "float32", as torch spells a dtype, for messages.
inline std::string dtype_short_name(c10::ScalarType t) {
  return std::string(c10::getDtypeNames(t).first);
}

// "member 3: float32 x 10 at 16 (scale 0.5, unscale 1)", one line per entry: for messages and
// tests.
std::string describe(const PackPlan& plan);

}  // namespace fluxmpi
