#include "fusion/pack_cpu.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <c10/util/Exception.h>

#include <cstring>

namespace fluxmpi {

namespace {

// d[j] = Dst(Op(s[j]) * scale), Op the source's math type (float for 16-bit sources), as
// torch computes (src.to(opmath) * scale).to(dst); the CUDA kernel does the same.
template <typename Src, typename Dst>
void convert(const Src* s, Dst* d, std::int64_t n, double scale) {
  using Op = at::opmath_type<Src>;
  const Op k = static_cast<Op>(scale);
  if (scale == 1.0) {
    for (std::int64_t j = 0; j < n; ++j) d[j] = static_cast<Dst>(static_cast<Op>(s[j]));
  } else {
    for (std::int64_t j = 0; j < n; ++j) d[j] = static_cast<Dst>(static_cast<Op>(s[j]) * k);
  }
}

// One member's span, `from` -> `to`: a memmove when nothing changes (it may be the same memory,
// a gradient that already lives in its slot), else the element loop for the dtype pair.
void convert_span(const void* src, c10::ScalarType from, void* dst, c10::ScalarType to,
                  std::int64_t n, double scale) {
  if (from == to && scale == 1.0) {
    if (src != dst) std::memmove(dst, src, static_cast<std::size_t>(n) * c10::elementSize(from));
    return;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(c10::kHalf, c10::kBFloat16, from, "pack_cpu", [&] {
    using Src = scalar_t;
    const auto* s = static_cast<const Src*>(src);
    AT_DISPATCH_FLOATING_TYPES_AND2(c10::kHalf, c10::kBFloat16, to, "pack_cpu", [&] {
      convert<Src, scalar_t>(s, static_cast<scalar_t*>(dst), n, scale);
    });
  });
}

}  // namespace

void check_pack_tensors(const PackPlan& plan, const std::vector<at::Tensor>& members,
                        const at::Tensor& flat, const char* what) {
  TORCH_CHECK_VALUE(flat.defined() && flat.scalar_type() == plan.wire && flat.is_contiguous() &&
                        flat.numel() >= plan.numel,
                    what, ": the flat buffer must be a contiguous ", dtype_short_name(plan.wire),
                    " tensor of at least ", plan.numel, " elements, got ",
                    flat.defined() ? std::string(dtype_short_name(flat.scalar_type())) + " x " +
                                         std::to_string(flat.numel())
                                   : std::string("an undefined tensor"));
  for (const auto& e : plan.entries) {
    TORCH_CHECK_VALUE(e.member < static_cast<std::int64_t>(members.size()), what, ": the plan has ",
                      "member ", e.member, " but ", members.size(), " tensors were given");
    const auto& t = members[e.member];
    TORCH_CHECK_VALUE(t.defined() && t.scalar_type() == e.dtype && t.numel() == e.numel &&
                          t.is_contiguous() && t.device() == flat.device(),
                      what, ": tensor ", e.member, " must be a contiguous ",
                      dtype_short_name(e.dtype), " tensor of ", e.numel, " elements on ",
                      flat.device(), ", got ",
                      t.defined() ? std::string(dtype_short_name(t.scalar_type())) + " x " +
                                        std::to_string(t.numel()) + " on " + t.device().str() +
                                        (t.is_contiguous() ? "" : ", not contiguous")
                                  : std::string("an undefined tensor"));
  }
}

void pack_cpu(const PackPlan& plan, const std::vector<at::Tensor>& members,
              const at::Tensor& flat) {
  check_pack_tensors(plan, members, flat, "pack");
  TORCH_CHECK_VALUE(flat.is_cpu(), "pack_cpu: the flat buffer is on ", flat.device());
  auto* base = static_cast<char*>(flat.data_ptr());
  const auto wsz = static_cast<std::int64_t>(c10::elementSize(plan.wire));
  for (const auto& e : plan.entries) {
    convert_span(members[e.member].const_data_ptr(), e.dtype, base + e.offset * wsz, plan.wire,
                 e.numel, e.scale);
  }
}

void unpack_cpu(const PackPlan& plan, const at::Tensor& flat,
                const std::vector<at::Tensor>& members) {
  check_pack_tensors(plan, members, flat, "unpack");
  TORCH_CHECK_VALUE(flat.is_cpu(), "unpack_cpu: the flat buffer is on ", flat.device());
  const auto* base = static_cast<const char*>(flat.const_data_ptr());
  const auto wsz = static_cast<std::int64_t>(c10::elementSize(plan.wire));
  for (const auto& e : plan.entries) {
    convert_span(base + e.offset * wsz, plan.wire, members[e.member].data_ptr(), e.dtype, e.numel,
                 e.unscale);
  }
}

}  // namespace fluxmpi
