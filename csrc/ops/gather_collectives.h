// The collectives that move rows (slices along dim 0) of tensors between ranks: allgather,
// gather, scatter, reduce_scatter, alltoall, and the grouped (fused) forms of allreduce_ and
// bcast_. Each takes a list of tensors (a single tensor is a list of one) and issues one
// agreement, at most one small exchange of row counts (only where they may differ by rank),
// and one data collective (one per dtype for reductions), whatever the number of tensors.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "ops/splits.h"

namespace fluxmpi {

// Each of these agrees with the other ranks, then moves the data; all must run inline on the
// engine or on its thread. `local_error`, when not empty, is a TypeError found by the caller
// (the Python wrapper), raised on every rank. Results are new tensors, never views of inputs.

// Tensor i of every rank, concatenated along dim 0 in rank order. Dim 0 may differ by rank;
// dtype and the other dims may not. `rows`, when given, gets each rank's dim 0 per tensor
// (rows[i][r]: the splits of the reverse reduce_scatter). `also_agree`, when not 0, joins the
// shapes the ranks must agree on (a hash of what the caller expects of every rank), and
// `also_text` describes it in the error when ranks differ.
std::vector<at::Tensor> allgather_checked(const std::vector<at::Tensor>& ts,
                                          const std::string& local_error = {},
                                          Splits* rows = nullptr, std::int64_t also_agree = 0,
                                          const std::string& also_text = {});
// The same, on the root only; the other ranks get an empty list (`rows` is filled on every
// rank).
std::vector<at::Tensor> gather_checked(const std::vector<at::Tensor>& ts, std::int64_t root,
                                       const std::string& local_error = {}, Splits* rows = nullptr,
                                       std::int64_t also_agree = 0,
                                       const std::string& also_text = {});
// Rank r gets part r of the root's tensor i. Every rank passes tensors of the same shapes and
// the same splits; only the root's values are read. `also_agree`, `also_text`: as above.
std::vector<at::Tensor> scatter_checked(const std::vector<at::Tensor>& ts, const Splits& splits,
                                        std::int64_t root, const std::string& local_error = {},
                                        std::int64_t also_agree = 0,
                                        const std::string& also_text = {});
// Rank r gets part r of the reduction over ranks of tensor i (same shapes and splits on every
// rank). op: "sum", "average", "min", "max", "prod".
std::vector<at::Tensor> reduce_scatter_checked(const std::vector<at::Tensor>& ts,
                                               const std::string& op, const Splits& splits,
                                               const std::string& local_error = {},
                                               std::int64_t also_agree = 0,
                                               const std::string& also_text = {});
// How many alltoalls this process has sent as the block form (every part one length: each
// rank sends each rank the same rows of each tensor), not as MPI_Alltoallv (for tests).
std::int64_t alltoall_block_calls();

// Part j of this rank's tensor i goes to rank j; result i is the parts sent to this rank, in
// rank order. Splits are each rank's own (they may differ by rank). `received`, when given,
// gets the row counts received from each rank (the splits of the reverse alltoall).
// `also_agree`, `also_text` (here and in reduce_scatter_checked): as in allgather_checked.
std::vector<at::Tensor> alltoall_checked(const std::vector<at::Tensor>& ts, const Splits& splits,
                                         Splits* received, const std::string& local_error = {},
                                         std::int64_t also_agree = 0,
                                         const std::string& also_text = {});
// allreduce_ / bcast_ of every tensor, in place, through one buffer per dtype (broadcast: one
// buffer in all).
void grouped_allreduce_checked(const std::vector<at::Tensor>& ts, const std::string& op,
                               const std::string& local_error = {});
void grouped_broadcast_checked(const std::vector<at::Tensor>& ts, std::int64_t root,
                               const std::string& local_error = {});
// A joined rank's part (ops/join.h) in one dtype's list of several tensors of the active
// ranks' grouped_allreduce_checked: `zeros` of the list's total count, on the path the list
// takes there.
void grouped_allreduce_zeros(Backend& b, const at::Tensor& zeros, ReduceOp op, int world);

}  // namespace fluxmpi
