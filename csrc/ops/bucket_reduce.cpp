#include "ops/bucket_reduce.h"

#include <ATen/ATen.h>

#include <sstream>

#include "backend/select.h"
#include "ops/bucket_pack.h"
#include "ops/collectives.h"
#include "ops/consensus.h"

namespace fluxmpi {

std::optional<c10::ScalarType> compressed_dtype(Compression c) {
  switch (c) {
    case Compression::Fp16: return c10::kHalf;
    case Compression::Bf16: return c10::kBFloat16;
    case Compression::None: break;
  }
  return std::nullopt;
}

std::vector<at::Tensor> real_views(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const auto& t : ts) out.push_back(as_pairs(t));
  return out;
}

std::string gradient_mismatch(const at::Tensor& p, const at::Tensor& g, const Bucket& bk,
                              std::int64_t planned) {
  // Every step's fresh gradients come here: compare first, format only what differs.
  const bool param_differs =
      p.numel() != planned || p.scalar_type() != bk.dtype || p.device() != bk.device;
  const bool grad_differs = !param_differs && g.defined() &&
                            (g.sizes() != p.sizes() || g.scalar_type() != bk.dtype ||
                             g.device() != bk.device || g.layout() != c10::kStrided);
  if (!param_differs && !grad_differs) return {};
  std::ostringstream out;
  if (param_differs) {
    out << "it has " << p.numel() << " elements of " << dtype_name(p.scalar_type()) << " on "
        << p.device() << ", but had " << planned << " of " << dtype_name(bk.dtype) << " on "
        << bk.device << " when its reduction was planned: resize, cast or move no parameter "
        << "after DistributedOptimizer or allreduce_gradients took it";
  } else {
    out << "its .grad is a " << g.layout() << " tensor of shape " << g.sizes() << ", "
        << dtype_name(g.scalar_type()) << " on " << g.device() << ", expected a dense ("
        << c10::kStrided << ") gradient of shape " << p.sizes() << ", " << dtype_name(bk.dtype)
        << " on " << bk.device;
  }
  return out.str();
}

void reduce_bucket(const at::Tensor& t, ReduceOp op, std::optional<c10::ScalarType> comp, int world,
                   bool prescaled, const at::Tensor& wire, const PackPlan& unpack_plan,
                   const std::vector<at::Tensor>& unpack_into) {
  Backend& be = backend_for(t);
  // A bucket whose contributions its pack pre-scaled for "average" is summed; any other (a
  // direct bucket, a float or double fused one) is averaged by the reduction itself.
  const ReduceOp wire_op = op == ReduceOp::Average && prescaled ? ReduceOp::Sum : op;
  if (wire.defined()) {
    // A fused bucket in 16 bits (the 1/world pre-scale keeps the sum from overflowing),
    // cast back into the slots by one unpack.
    allreduce_data(be, wire, wire_op, world, HalfReduction::Wire16);
    unpack(unpack_plan, wire, unpack_into);
  } else if (comp && *comp != t.scalar_type()) {
    // Travel in 16 bits (the 1/world pre-scale keeps the sum from overflowing).
    at::Tensor h = t.to(*comp);
    allreduce_data(be, h, wire_op, world, HalfReduction::Wire16);
    t.copy_(h);
  } else {
    // 16-bit gradients on a GPU reduce in 16 bits, each combine rounded, as DDP's do on
    // NCCL (half the bytes of an fp32 temporary; bit-identical to it at 2 ranks, where
    // there is one combine). On the host they accumulate in fp32, as the MPI path does.
    const auto half = t.is_cuda() ? HalfReduction::Wire16 : HalfReduction::Fp32;
    allreduce_data(be, t, wire_op, world, half);
  }
}

Compression parse_compression(const std::string& name) {
  if (name.empty() || name == "none") return Compression::None;
  if (name == "fp16" || name == "float16") return Compression::Fp16;
  if (name == "bf16" || name == "bfloat16") return Compression::Bf16;
  TORCH_CHECK_VALUE(false, "DistributedOptimizer(compression='", name,
                    "'): expected None, 'fp16' or 'bf16'");
}

const char* compression_name(Compression c) {
  switch (c) {
    case Compression::Fp16: return "fp16";
    case Compression::Bf16: return "bf16";
    case Compression::None: break;
  }
  return "none";
}

}  // namespace fluxmpi
