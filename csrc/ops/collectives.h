// Tensor collectives: the shared core of allreduce_, bcast_, reduce_ and their async forms.
// Each checks its arguments locally, agrees with the other ranks (ops/consensus.h), then moves
// the data in place. Validation never throws before agree(), so every rank raises together.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "backend/backend.h"
#include "ops/consensus.h"

namespace fluxmpi {

// Local checks shared by every tensor collective: supported dtype, strided layout, device.
// Returns the error class and fills `msg`, or ErrorClass::None.
ErrorClass validate_tensor(const at::Tensor& t, std::string& msg);

// Data movement only, no agreement: `t` any layout of a supported dtype; in place.
// Average is a sum then a division (16-bit floats: a pre-scale, so the sum cannot overflow).
void allreduce_data(Backend& b, const at::Tensor& t, ReduceOp op, int world);
void broadcast_data(Backend& b, const at::Tensor& t, int root);
void reduce_data(Backend& b, const at::Tensor& t, ReduceOp op, int root, int rank, int world);

// Full collectives: agree, then move. Must run inline on the engine or on its thread.
void allreduce_checked(const at::Tensor& t, const std::string& op);
void broadcast_checked(const at::Tensor& t, std::int64_t root);
void reduce_checked(const at::Tensor& t, const std::string& op, std::int64_t root);

}  // namespace fluxmpi
