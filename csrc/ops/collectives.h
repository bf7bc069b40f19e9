// Tensor collectives: the shared core of allreduce_, bcast_, reduce_, their async forms and
// barrier. Each checks its arguments locally, agrees with the other ranks (ops/consensus.h),
// then moves the data in place. Validation never throws before agree(), so every rank raises
// together.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "backend/backend.h"
#include "ops/consensus.h"
#include "ops/wire.h"

namespace fluxmpi {

// Local checks shared by every tensor collective: supported dtype, strided layout, device,
// no internal overlap (an expand()ed tensor cannot take a result in place).
// Returns the error class and fills `msg`, or ErrorClass::None.
ErrorClass validate_tensor(const at::Tensor& t, std::string& msg);

// Shared with the other tensor collectives (ops/gather_collectives.h):
// "tensor of shape [2, 3], dtype torch.float32, on cpu", for messages.
std::string describe(const at::Tensor& t);
// Parse `name` into s.op; a bad name becomes this rank's ValueError (s.error, `msg`).
ReduceOp parse_op_into(const std::string& name, Signature& s, std::string& msg);

// While one is alive on this thread, parse_op_into's "sum" signs the agreement as PREMUL_SUM
// (kPremulSumSignatureOp): the c10d backend scales its copies, then runs a sum inside one, so
// that a PREMUL_SUM on one rank and a SUM on another disagree instead of mixing scaled and
// unscaled tensors. The data still moves as a sum. Not nestable.
// s.op for a sum in `order`: a sum in gloo's order signs as its own op (kGlooSumSignatureOp, or
// kGlooPremulSumSignatureOp inside a PremulSumScope), so that ranks whose orders differ raise
// instead of running different algorithms. No-op for other ops and for SumOrder::Fastest.
void sign_sum_order(Signature& s, SumOrder order);
// The ReduceOp and SumOrder that an agreed s.op stands for (a joined rank's shadow call).
ReduceOp signature_reduce_op(std::int64_t op);
SumOrder signature_sum_order(std::int64_t op);

class PremulSumScope {
 public:
  PremulSumScope();
  ~PremulSumScope();
  PremulSumScope(const PremulSumScope&) = delete;
  PremulSumScope& operator=(const PremulSumScope&) = delete;
};
// A bitwise op (band, bor, bxor) on a floating-point tensor becomes this rank's TypeError, on
// a CUDA tensor its ValueError (NCCL has no bitwise reductions); no-op when `s` has an error.
void check_op_dtype(ReduceOp op, const at::Tensor& t, Signature& s, std::string& msg);

// Data movement only, no agreement: `t` any strided layout of a supported dtype; in place,
// without autograd (the version counter is bumped as for any in-place op). Average is a sum
// then a division; for integers the floor of the mean, summed in int64 so it cannot wrap.
// With SumOrder::Gloo a float sum over 3 or more ranks adds them in gloo's order where the
// backend has it (backend/mpi_ring.h), 16-bit floats rounded at each addition: the caller
// signed its agreement with that order (sum_signature_op).
void allreduce_data(Backend& b, const at::Tensor& t, ReduceOp op, int world,
                    HalfReduction half = HalfReduction::Fp32, SumOrder order = SumOrder::Fastest);
void broadcast_data(Backend& b, const at::Tensor& t, int root);
void reduce_data(Backend& b, const at::Tensor& t, ReduceOp op, int root, int rank, int world);

// A complex tensor's real view (pairs of reals; writes go through), else `t` itself (also a
// conjugate-bit complex tensor, which has none): how complex values move where the pairs give
// the right result (broadcasts, gathers, sums and averages).
at::Tensor as_pairs(const at::Tensor& t);

// Full collectives: agree, then move. Must run inline on the engine or on its thread.
// `local_error`, when not empty, is a TypeError found by the caller (the Python wrapper: "not
// a tensor", "root_rank is not an int"); it is raised on every rank like any other.
void allreduce_checked(const at::Tensor& t, const std::string& op,
                       const std::string& local_error = {});
void broadcast_checked(const at::Tensor& t, std::int64_t root, const std::string& local_error = {});
void reduce_checked(const at::Tensor& t, const std::string& op, std::int64_t root,
                    const std::string& local_error = {});
// Agree that every rank is in a barrier, then wait for all of them (MPI, whatever devices the
// ranks use).
void barrier_checked();

}  // namespace fluxmpi
