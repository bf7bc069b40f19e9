#include "c10d/list_collectives.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <sstream>

#include "ops/collectives.h"
#include "ops/gather_collectives.h"
#include "runtime/group.h"
#include "runtime/hash.h"

namespace fluxmpi {

namespace {

// One row holding all of t's elements: the unit the row collectives move.
at::Tensor as_row(const at::Tensor& t) { return t.defined() ? t.reshape({1, -1}) : t; }

std::string describe_output(const at::Tensor& o) {
  std::ostringstream s;
  if (!o.defined()) return "an undefined tensor";
  s << "a tensor of " << o.numel() << " elements of " << dtype_name(o.scalar_type());
  return s.str();
}

// "" when `o` can hold `numel` elements of `like`'s dtype, else why not (named by `what`).
std::string check_output(const at::Tensor& o, std::int64_t numel, const at::Tensor& like,
                         const std::string& what) {
  if (!like.defined()) return {};
  if (o.defined() && o.numel() == numel && o.scalar_type() == like.scalar_type()) return {};
  std::ostringstream s;
  s << what << " is " << describe_output(o) << ", expected " << numel << " elements of "
    << dtype_name(like.scalar_type());
  return s.str();
}

std::string count_error(const char* what, std::size_t got, std::size_t want) {
  return std::string(what) + " has " + std::to_string(got) + " tensors, expected " +
         std::to_string(want);
}

// Copy the flat elements of `src` into `dst` (same number of elements).
void copy_flat(const at::Tensor& dst, const at::Tensor& src) {
  dst.copy_(src.reshape(dst.sizes()));
}

void set_once(std::string& err, const std::string& e) {
  if (err.empty()) err = e;
}

}  // namespace

void allgather_lists(const std::vector<std::vector<at::Tensor>>& outputs,
                     const std::vector<at::Tensor>& inputs) {
  const Group& e = current_group();
  const auto world = static_cast<std::size_t>(e.size());
  const auto me = static_cast<std::size_t>(e.rank());
  std::string err;
  if (outputs.size() != inputs.size())
    set_once(err, count_error("output lists", outputs.size(), inputs.size()));
  // Outputs may differ in size by rank, as torch documents (NCCL takes them; gloo does not):
  // output r holds rank r's input. Every rank must expect the same sizes (they join the
  // agreement) and hold its own input's in its own place (checked here), so each rank's part
  // fits every output before any data moves.
  std::vector<std::int64_t> sizes;
  for (std::size_t i = 0; i < outputs.size() && i < inputs.size() && err.empty(); ++i) {
    if (outputs[i].size() != world) {
      set_once(err, count_error("the output list", outputs[i].size(), world) + " (one per rank)");
    }
    for (std::size_t r = 0; r < outputs[i].size() && err.empty(); ++r) {
      const at::Tensor& o = outputs[i][r];
      const std::int64_t want = r == me || !o.defined() ? inputs[i].numel() : o.numel();
      set_once(err, check_output(o, want, inputs[i],
                                 "output " + std::to_string(r) +
                                     (r == me ? " (this rank's input goes there)" : "")));
      sizes.push_back(o.defined() ? o.numel() : -1);
    }
  }
  const std::int64_t expected = err.empty() && !sizes.empty()
                                    ? hash_bytes(sizes.data(), sizes.size() * sizeof(sizes[0]), 1)
                                    : 0;
  std::ostringstream text;  // names the expected sizes where ranks differ
  for (std::size_t i = 0; i < sizes.size(); i += world) {
    text << (i == 0 ? ", and outputs of " : "; ")
         << c10::IntArrayRef(sizes).slice(i, std::min(world, sizes.size() - i)) << " elements";
  }
  std::vector<at::Tensor> cols;  // one element per row: the row count may differ by rank
  for (const auto& t : inputs) cols.push_back(t.defined() ? t.reshape({-1, 1}) : t);
  auto got = allgather_checked(cols, err, nullptr, expected, text.str());
  c10::AutoGradMode no_grad(false);
  for (std::size_t i = 0; i < got.size(); ++i) {
    std::int64_t at = 0;
    for (std::size_t r = 0; r < world; ++r) {
      const std::int64_t m = outputs[i][r].numel();
      copy_flat(outputs[i][r], got[i].narrow(0, at, m));
      at += m;
    }
  }
}

void allgather_into_tensors(const std::vector<at::Tensor>& outputs,
                            const std::vector<at::Tensor>& inputs) {
  const int world = current_group().size();
  std::string err;
  if (outputs.size() != inputs.size())
    set_once(err, count_error("outputs", outputs.size(), inputs.size()));
  for (std::size_t i = 0; i < outputs.size() && i < inputs.size() && err.empty(); ++i) {
    set_once(err, check_output(outputs[i], world * inputs[i].numel(), inputs[i],
                               "the output tensor (world size x input)"));
  }
  std::vector<at::Tensor> rows;
  for (const auto& t : inputs) rows.push_back(as_row(t));
  auto got = allgather_checked(rows, err);
  c10::AutoGradMode no_grad(false);
  for (std::size_t i = 0; i < got.size(); ++i) copy_flat(outputs[i], got[i]);
}

void gather_lists(const std::vector<std::vector<at::Tensor>>& outputs,
                  const std::vector<at::Tensor>& inputs, std::int64_t root) {
  const Group& e = current_group();
  std::string err;
  if (inputs.size() != 1) set_once(err, count_error("the input list", inputs.size(), 1));
  const bool is_root = e.rank() == root;
  if (err.empty() && is_root) {
    if (outputs.size() != 1 || outputs[0].size() != static_cast<std::size_t>(e.size())) {
      set_once(err, "on the root, gather_list must hold " + std::to_string(e.size()) +
                        " tensors (one per rank)");
    }
    for (std::size_t r = 0; err.empty() && r < outputs[0].size(); ++r) {
      set_once(err, check_output(outputs[0][r], inputs[0].numel(), inputs[0],
                                 "gather_list[" + std::to_string(r) + "]"));
    }
  }
  std::vector<at::Tensor> rows;
  for (const auto& t : inputs) rows.push_back(as_row(t));
  auto got = gather_checked(rows, root, err);
  if (!is_root || got.empty()) return;
  c10::AutoGradMode no_grad(false);
  for (int r = 0; r < e.size(); ++r) copy_flat(outputs[0][r], got[0][r]);
}

void scatter_lists(const std::vector<at::Tensor>& outputs,
                   const std::vector<std::vector<at::Tensor>>& inputs, std::int64_t root) {
  const Group& e = current_group();
  std::string err;
  at::Tensor out = outputs.size() == 1 ? outputs[0] : at::Tensor();
  if (!out.defined()) set_once(err, count_error("the output list", outputs.size(), 1));
  const bool is_root = e.rank() == root;
  if (err.empty() && is_root) {
    if (inputs.size() != 1 || inputs[0].size() != static_cast<std::size_t>(e.size())) {
      set_once(err, "on the root, scatter_list must hold " + std::to_string(e.size()) +
                        " tensors (one per rank)");
    }
    for (std::size_t r = 0; err.empty() && r < inputs[0].size(); ++r) {
      set_once(err, check_output(inputs[0][r], out.numel(), out,
                                 "scatter_list[" + std::to_string(r) + "]"));
    }
  }
  at::Tensor buf;
  {
    c10::AutoGradMode no_grad(false);
    if (!out.defined()) {
      buf = at::empty({e.size(), 0}, at::kFloat);
    } else if (is_root && err.empty()) {
      std::vector<at::Tensor> flat;
      for (const auto& t : inputs[0]) flat.push_back(t.reshape(-1));
      buf = at::stack(flat);
    } else {
      buf = at::empty({e.size(), out.numel()}, out.options());
    }
  }
  auto got = scatter_checked({buf}, {}, root, err);
  c10::AutoGradMode no_grad(false);
  copy_flat(out, got[0]);
}

void reduce_scatter_lists(const std::vector<at::Tensor>& outputs,
                          const std::vector<std::vector<at::Tensor>>& inputs, const std::string& op,
                          const std::string& local_error) {
  const Group& e = current_group();
  std::string err = local_error;
  at::Tensor out = outputs.size() == 1 ? outputs[0] : at::Tensor();
  if (!out.defined()) set_once(err, count_error("the output list", outputs.size(), 1));
  if (inputs.size() != 1 || inputs[0].size() != static_cast<std::size_t>(e.size())) {
    set_once(err,
             "the input list must hold " + std::to_string(e.size()) + " tensors (one per rank)");
  }
  for (std::size_t r = 0; err.empty() && r < inputs[0].size(); ++r) {
    set_once(err, check_output(inputs[0][r], out.numel(), out, "input " + std::to_string(r)));
  }
  at::Tensor buf;
  {
    c10::AutoGradMode no_grad(false);
    if (err.empty()) {
      std::vector<at::Tensor> flat;
      for (const auto& t : inputs[0]) flat.push_back(t.reshape(-1));
      buf = at::stack(flat);
    } else {
      buf = at::empty({e.size(), out.defined() ? out.numel() : 0},
                      out.defined() ? out.options() : at::TensorOptions(at::kFloat));
    }
  }
  auto got = reduce_scatter_checked({buf}, op, {}, err);
  c10::AutoGradMode no_grad(false);
  copy_flat(out, got[0]);
}

void reduce_scatter_tensors(const std::vector<at::Tensor>& outputs,
                            const std::vector<at::Tensor>& inputs, const std::string& op,
                            const std::string& local_error) {
  const int world = current_group().size();
  std::string err = local_error;
  if (outputs.size() != inputs.size())
    set_once(err, count_error("outputs", outputs.size(), inputs.size()));
  for (std::size_t i = 0; i < outputs.size() && i < inputs.size() && err.empty(); ++i) {
    set_once(err, check_output(inputs[i], world * outputs[i].numel(), outputs[i],
                               "the input tensor (world size x output)"));
  }
  std::vector<at::Tensor> bufs;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (err.empty()) {
      bufs.push_back(inputs[i].reshape({world, outputs[i].numel()}));
    } else {
      bufs.push_back(inputs[i].defined() ? inputs[i].reshape({1, -1}) : inputs[i]);
    }
  }
  auto got = reduce_scatter_checked(bufs, op, {}, err);
  c10::AutoGradMode no_grad(false);
  for (std::size_t i = 0; i < got.size(); ++i) copy_flat(outputs[i], got[i]);
}

void alltoall_single(const at::Tensor& output, const at::Tensor& input,
                     const std::vector<std::int64_t>& output_splits,
                     const std::vector<std::int64_t>& input_splits) {
  std::string err;
  if (input.defined() && output.defined() && input.dim() > 0 &&
      (output.dim() != input.dim() || output.scalar_type() != input.scalar_type() ||
       output.sizes().slice(1) != input.sizes().slice(1))) {
    std::ostringstream s;
    s << "output of shape " << output.sizes() << " and dtype " << dtype_name(output.scalar_type())
      << " cannot hold rows of the input of shape " << input.sizes() << " and dtype "
      << dtype_name(input.scalar_type());
    err = s.str();
  }
  Splits splits;
  if (!input_splits.empty()) splits.push_back(input_splits);
  Splits received;
  auto got = alltoall_checked({input}, splits, &received, err);
  // Every rank has its rows now; what the output expects is this rank's own business.
  const auto& rows = received[0];
  if (!output_splits.empty()) {
    TORCH_CHECK_VALUE(output_splits == rows, "fluxmpi: output_split_sizes ",
                      c10::IntArrayRef(output_splits), " differ from the rows sent to rank ",
                      current_group().rank(), ": ", c10::IntArrayRef(rows));
  }
  TORCH_CHECK_VALUE(output.size(0) == got[0].size(0), "fluxmpi: all_to_all_single output has ",
                    output.size(0), " rows, but rank ", current_group().rank(), " received ",
                    got[0].size(0));
  c10::AutoGradMode no_grad(false);
  output.copy_(got[0]);
}

void alltoall_lists(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs) {
  const auto world = static_cast<std::size_t>(current_group().size());
  std::string err;
  if (inputs.size() != world) set_once(err, count_error("the input list", inputs.size(), world));
  if (outputs.size() != world) set_once(err, count_error("the output list", outputs.size(), world));
  for (std::size_t r = 0; err.empty() && r < world; ++r) {
    if (inputs[r].scalar_type() != inputs[0].scalar_type() ||
        outputs[r].scalar_type() != inputs[0].scalar_type()) {
      set_once(err, "all_to_all takes tensors of one dtype; tensor " + std::to_string(r) +
                        " differs from tensor 0");
    }
  }
  at::Tensor flat;
  Splits splits;
  {
    c10::AutoGradMode no_grad(false);
    if (err.empty()) {
      std::vector<at::Tensor> parts;
      std::vector<std::int64_t> sp;
      for (const auto& t : inputs) {
        parts.push_back(t.reshape(-1));
        sp.push_back(t.numel());
      }
      flat = at::cat(parts);
      splits.push_back(sp);
    } else {
      flat = at::empty({0}, at::kFloat);
    }
  }
  Splits received;
  auto got = alltoall_checked({flat}, splits, &received, err);
  std::int64_t pos = 0;
  c10::AutoGradMode no_grad(false);
  for (std::size_t r = 0; r < world; ++r) {
    const std::int64_t n = received[0][r];
    TORCH_CHECK_VALUE(n == outputs[r].numel(), "fluxmpi: all_to_all output ", r, " holds ",
                      outputs[r].numel(), " elements, but rank ", r, " sent ", n);
    copy_flat(outputs[r], got[0].narrow(0, pos, n));
    pos += n;
  }
}

}  // namespace fluxmpi
