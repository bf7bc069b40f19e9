// torch.distributed's tensor-list collectives (all_gather into a list, scatter from a list,
// all_to_all of lists, the *_into_tensor forms) in terms of fluxmpi's row collectives
// (ops/gather_collectives.h): each tensor travels as one row of its flattened elements, and
// the results are copied into the caller's output tensors. Shapes and dtypes of the outputs
// are checked on each rank and join the agreement, so a bad output raises on every rank.
// Each runs on the engine thread (or inline on it), over the current group (runtime/group.h):
// ranks and sizes are the group's.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace fluxmpi {

// outputs[i][r] = rank r's inputs[i].
void allgather_lists(const std::vector<std::vector<at::Tensor>>& outputs,
                     const std::vector<at::Tensor>& inputs);
// outputs[i] = every rank's inputs[i], concatenated in rank order (as flat elements).
void allgather_into_tensors(const std::vector<at::Tensor>& outputs,
                            const std::vector<at::Tensor>& inputs);
// On `root`: outputs[0][r] = rank r's inputs[0]; other ranks pass no outputs.
void gather_lists(const std::vector<std::vector<at::Tensor>>& outputs,
                  const std::vector<at::Tensor>& inputs, std::int64_t root);
// outputs[0] = the root's inputs[0][rank]; other ranks pass no inputs.
void scatter_lists(const std::vector<at::Tensor>& outputs,
                   const std::vector<std::vector<at::Tensor>>& inputs, std::int64_t root);
// outputs[0] = reduction over ranks of inputs[0][rank].
void reduce_scatter_lists(const std::vector<at::Tensor>& outputs,
                          const std::vector<std::vector<at::Tensor>>& inputs, const std::string& op,
                          const std::string& local_error);
// outputs[i] = part `rank` (of world equal parts) of the reduction of inputs[i].
void reduce_scatter_tensors(const std::vector<at::Tensor>& outputs,
                            const std::vector<at::Tensor>& inputs, const std::string& op,
                            const std::string& local_error);
// Rows of `input` cut by input_splits (equal parts when empty) go to the ranks in order;
// `output` receives every rank's part for this rank, in rank order.
void alltoall_single(const at::Tensor& output, const at::Tensor& input,
                     const std::vector<std::int64_t>& output_splits,
                     const std::vector<std::int64_t>& input_splits);
// outputs[r] = rank r's inputs[rank].
void alltoall_lists(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs);

}  // namespace fluxmpi
