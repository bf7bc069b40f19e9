// Python face of the gradient reducer (ops/gradient_reducer.h), of the bucket planner
// (fusion/bucket_plan.h), which tests call without Init, and of the exact sums' element kernels
// (ops/exact_sum.h) and its sharded bucket (ops/exact_shards.h).
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "fusion/bucket_plan.h"
#include "ops/exact_shards.h"
#include "ops/exact_sum.h"
#include "ops/gradient_reducer.h"
#include "python/bindings.h"
#include "runtime/environment.h"

namespace py = pybind11;

namespace fluxmpi {

namespace {

py::list buckets_to_python(const std::vector<Bucket>& buckets) {
  py::list out;
  for (const auto& b : buckets) {
    py::dict d;
    d["members"] = b.members;
    d["direct"] = b.direct;
    d["numel"] = b.numel;
    d["dtype"] = std::string(c10::toString(b.dtype));
    d["device"] = b.device.str();
    out.append(d);
  }
  return out;
}

// compression as Python spells it: None, or a name parse_compression knows.
Compression compression_from_python(const py::object& v) {
  if (v.is_none()) return Compression::None;
  if (py::isinstance<py::str>(v)) return parse_compression(v.cast<std::string>());
  return parse_compression(py::repr(v).cast<std::string>());  // a ValueError that shows it
}

py::object compression_to_python(Compression c) {
  if (c == Compression::None) return py::none();
  return py::str(compression_name(c));
}

// Gradients are floating point: the bitwise ops that parse_op also knows do not apply.
ReduceOp gradient_op(const std::string& name) {
  const ReduceOp op = parse_op(name);
  TORCH_CHECK_VALUE(!is_bitwise(op), "fluxmpi_py: op '", name,
                    "' is bitwise; gradients are reduced with sum, average, min, max or prod");
  return op;
}

}  // namespace

void bind_gradients(py::module_& m) {
  const PlanOptions dp;
  py::class_<PlanOptions> plan(m, "PlanOptions",
                               "The bucket planner's limits (bytes), checked when built");
  plan.def(py::init([](std::int64_t cap_bytes, std::int64_t direct_min_bytes,
                       std::int64_t cuda_direct_min_bytes, std::int64_t first_cap_bytes) {
             PlanOptions o;
             o.cap_bytes = cap_bytes;
             o.direct_min_bytes = direct_min_bytes;
             o.cuda_direct_min_bytes = cuda_direct_min_bytes;
             o.first_cap_bytes = first_cap_bytes;
             check_bucket_options(o);
             return o;
           }),
           py::kw_only(), py::arg("cap_bytes") = dp.cap_bytes,
           py::arg("direct_min_bytes") = dp.direct_min_bytes,
           py::arg("cuda_direct_min_bytes") = dp.cuda_direct_min_bytes,
           py::arg("first_cap_bytes") = dp.first_cap_bytes)
      .def_readwrite("cap_bytes", &PlanOptions::cap_bytes, "a fused bucket never exceeds this")
      .def_readwrite("direct_min_bytes", &PlanOptions::direct_min_bytes,
                     "host tensors at least this large are reduced alone, in their own storage")
      .def_readwrite("cuda_direct_min_bytes", &PlanOptions::cuda_direct_min_bytes,
                     "the same for CUDA tensors (default: none; every one is fused, as in DDP)")
      .def_readwrite("first_cap_bytes", &PlanOptions::first_cap_bytes,
                     "the first bucket of each dtype and device closes here (0: at cap_bytes)");
  def_fields(plan, {"cap_bytes", "direct_min_bytes", "cuda_direct_min_bytes", "first_cap_bytes"});

  const ReducerOptions dr;
  py::class_<ReducerOptions> reducer(m, "ReducerOptions", "How a GradientReducer reduces");
  reducer
      .def(py::init([](const PlanOptions& plan, const std::string& op, const py::object& comp,
                       std::int64_t plan_hash) {
             ReducerOptions o;
             o.plan = plan;
             o.op = gradient_op(op);
             o.compression = compression_from_python(comp);
             o.plan_hash = plan_hash;
             return o;
           }),
           py::kw_only(), py::arg("plan") = dr.plan, py::arg("op") = op_name(dr.op),
           py::arg("compression") = py::none(), py::arg("plan_hash") = dr.plan_hash)
      .def_readwrite("plan", &ReducerOptions::plan)
      .def_property(
          "op", [](const ReducerOptions& o) { return std::string(op_name(o.op)); },
          [](ReducerOptions& o, const std::string& op) { o.op = gradient_op(op); },
          "'sum' or 'average' (also 'avg', 'mean'; 'min', 'max', 'prod')")
      .def_property(
          "compression",
          [](const ReducerOptions& o) { return compression_to_python(o.compression); },
          [](ReducerOptions& o, const py::object& v) {
            o.compression = compression_from_python(v);
          },
          "None, 'fp16' or 'bf16' (also 'float16', 'bfloat16'): buckets travel in 16 bits")
      .def_readwrite("plan_hash", &ReducerOptions::plan_hash,
                     "identity of the parameter list, compared across ranks every step");
  def_fields(reducer, {"plan", "op", "compression", "plan_hash"});

  m.def(
      "plan_buckets",
      [](const std::vector<at::Tensor>& tensors, const PlanOptions& options,
         const std::optional<std::vector<std::string>>& devices,
         std::optional<std::int64_t> element_bytes, bool direct) {
        TORCH_CHECK_VALUE(!devices || devices->size() == tensors.size(),
                          "plan_buckets: ", tensors.size(), " tensors but ",
                          devices ? devices->size() : 0, " devices");
        std::vector<TensorMeta> metas;
        metas.reserve(tensors.size());
        for (std::size_t i = 0; i < tensors.size(); ++i) {
          const auto& t = tensors[i];
          const c10::Device dev = devices ? c10::Device((*devices)[i]) : t.device();
          metas.push_back({t.scalar_type(), dev, t.numel()});
        }
        return buckets_to_python(plan_buckets(metas, options, element_bytes.value_or(0), direct));
      },
      py::arg("tensors"), py::arg("options"), py::arg("devices") = py::none(),
      py::arg("element_bytes") = py::none(), py::arg("direct") = true,
      "The bucket plan for tensors' dtypes, devices and sizes: a list of dicts (members, "
      "direct, numel, dtype, device) in issue order. Pure: needs no Init. `devices` plans "
      "tensor i as if it lived on devices[i] (\"cuda:0\"), so that the CUDA plan is tested "
      "without a GPU. `element_bytes`: the bytes a value takes in the buckets' buffers (8 for "
      "the exact path's int64 sums); None: each tensor's dtype size. `direct=False`: no tensor "
      "goes direct (a path that copies every value into its buffers)");

  // allreduce_gradients' plan cache compares a call's parameters with the cached ones by
  // identity: ~1 ns a tensor here against ~25 ns in Python's all(map(operator.is_, ...)).
  m.def(
      "same_objects",
      [](const py::list& a, const py::list& b) {
        if (a.size() != b.size()) return false;
        for (std::size_t i = 0; i < a.size(); ++i) {
          if (PyList_GET_ITEM(a.ptr(), i) != PyList_GET_ITEM(b.ptr(), i)) return false;
        }
        return true;
      },
      py::arg("a"), py::arg("b"),
      "Whether lists a and b hold the same objects (by identity) in the same order");

  py::class_<GradientReducer, std::shared_ptr<GradientReducer>>(m, "GradientReducer")
      .def(py::init([](std::vector<at::Tensor> params, const ReducerOptions& options) {
             return std::make_shared<GradientReducer>(std::move(params), options);
           }),
           py::arg("params"), py::arg("options"))
      .def("mark_ready", &GradientReducer::mark_ready, py::arg("index"),
           py::arg("local_error") = "")
      .def("name_parameters", &GradientReducer::name_parameters, py::arg("names"))
      .def(
          "finalize",
          [](GradientReducer& r, bool flag, const std::string& error,
             std::optional<ErrorClass> cls) {  // (ErrorClass is bound after this file)
            return r.finalize(flag, error, cls.value_or(ErrorClass::Runtime));
          },
          py::arg("flag") = false, py::arg("local_error") = "", py::arg("error_class") = py::none(),
          py::call_guard<py::gil_scoped_release>())
      .def("watch_requires_grad", &GradientReducer::watch_requires_grad, py::arg("tensors"))
      .def("requires_grad_changed", &GradientReducer::requires_grad_changed)
      .def_property_readonly("launched_early", &GradientReducer::launched_early)
      .def("plan", [](const GradientReducer& r) { return buckets_to_python(r.plan()); });

  m.def("exact_quantize", &exact_quantize, py::arg("grad"), py::arg("acc"), py::arg("scale"),
        py::arg("bound"), py::arg("accumulate"), py::call_guard<py::gil_scoped_release>(),
        "acc (+)= round(grad * scale) where |grad| < bound (else 0), in one pass; returns the "
        "largest |grad| (NaN when grad holds a NaN). The exact sums' quantizer (no Init)");
  m.def("exact_dequantize", &exact_dequantize, py::arg("sum"), py::arg("out"), py::arg("divisor"),
        py::call_guard<py::gil_scoped_release>(),
        "out = out.dtype(float64(sum) / divisor), in one pass (no Init)");
  m.def("exact_sum_rows", &exact_sum_rows, py::arg("rows"), py::arg("out"), py::arg("scale"),
        py::arg("bound"), py::arg("divisor"), py::call_guard<py::gil_scoped_release>(),
        "out = out.dtype(float64(sum over the rows of round(rows * scale)) / divisor), the sum "
        "exact (float64 where that is exact, else int64), values at or beyond bound adding 0; "
        "returns the largest |rows| (NaN for a NaN). The sharded exact sum's owner pass (no "
        "Init)");
  m.def("set_exact_float64_pass", &set_exact_float64_pass, py::arg("on"),
        "Turns the owner pass's float64 blocks off (every block summed in int64) or on; returns "
        "the previous setting (for tests; no Init)");
  m.def("exact_sum_block_counts", &exact_sum_block_counts,
        "(float64 blocks, int64 blocks) the owner passes of this process have summed (for "
        "tests)");
  m.def(
      "exact_shard_bucket",
      [](std::int64_t index, std::int64_t plan, std::vector<at::Tensor> pieces,
         const at::Tensor& flat, const at::Tensor& rows, const at::Tensor& most,
         const std::vector<std::tuple<std::int64_t, std::int64_t, double, double, double>>& segs,
         std::string label, int passes) {
        env();
        std::vector<ShardSegment> segments;
        segments.reserve(segs.size());
        for (const auto& [start, end, scale, bound, divisor] : segs)
          segments.push_back({start, end, scale, bound, divisor});
        return start_exact_shard_bucket(index, plan, std::move(pieces), flat, rows, most,
                                        std::move(segments), std::move(label), passes);
      },
      py::arg("index"), py::arg("plan"), py::arg("pieces"), py::arg("flat"), py::arg("rows"),
      py::arg("most"), py::arg("segments"), py::arg("label"), py::kw_only(), py::arg("passes") = 1,
      "Start one bucket of the sharded exact sum on the engine (ops/exact_shards.h): pieces are "
      "the bucket's gradients in order (reduced in place), segments (start, end, scale, bound, "
      "divisor) in this rank's shard; passes > 1: the pieces hold that many passes' gradients "
      "(flat and rows that many buckets), summed in one exchange; returns its Work");
}

}  // namespace fluxmpi
