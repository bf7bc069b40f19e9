// Python face of the shard math (ops/shard.h): plain integers in, indices out. The tensor and
// iterator forms let Python pay one call per chunk or per epoch instead of one per index.
#include <Python.h>

#include <ATen/ATen.h>

#include <tuple>

#include "ops/shard.h"
#include "python/bindings.h"
#include "python/shard_iterator.h"

namespace py = pybind11;

namespace fluxmpi {
namespace {

ShardSpec make_spec(std::int64_t n, std::int64_t world, std::int64_t rank, const std::string& mode,
                    bool shuffle, std::uint64_t seed, std::uint64_t epoch) {
  ShardSpec s;
  s.n = n;
  s.world = world;
  s.rank = rank;
  s.mode = parse_shard_mode(mode);
  s.shuffle = shuffle;
  s.seed = seed;
  s.epoch = epoch;
  return s;
}

}  // namespace

void bind_shard(py::module_& m) {
  if (!register_shard_iterator(m.ptr())) throw py::error_already_set();
  m.def(
      "shard_range",
      [](std::int64_t n, std::int64_t world, std::int64_t rank, const std::string& mode) {
        ShardRange r = shard_range(n, world, rank, parse_shard_mode(mode));
        return std::make_tuple(r.start, r.length);
      },
      py::arg("n"), py::arg("world_size"), py::arg("rank"), py::arg("mode"),
      "(start, length) of rank's positions in the epoch's order; positions are taken mod n");

  m.def(
      "shard_index",
      [](std::int64_t n, std::int64_t world, std::int64_t rank, const std::string& mode,
         bool shuffle, std::uint64_t seed, std::uint64_t epoch, std::int64_t position) {
        return ShardIndexer(make_spec(n, world, rank, mode, shuffle, seed, epoch)).at(position);
      },
      py::arg("n"), py::arg("world_size"), py::arg("rank"), py::arg("mode"), py::arg("shuffle"),
      py::arg("seed"), py::arg("epoch"), py::arg("position"),
      "The global index at `position` of rank's shard");

  m.def(
      "shard_indices",
      [](std::int64_t n, std::int64_t world, std::int64_t rank, const std::string& mode,
         bool shuffle, std::uint64_t seed, std::uint64_t epoch, std::int64_t first,
         std::int64_t count) {
        ShardIndexer ix(make_spec(n, world, rank, mode, shuffle, seed, epoch));
        ix.check_positions(first, count);  // before allocating `count` elements
        at::Tensor out = at::empty({count}, at::kLong);
        {
          py::gil_scoped_release nogil;
          ix.fill(first, count, out.data_ptr<std::int64_t>());
        }
        return out;
      },
      py::arg("n"), py::arg("world_size"), py::arg("rank"), py::arg("mode"), py::arg("shuffle"),
      py::arg("seed"), py::arg("epoch"), py::arg("first"), py::arg("count"),
      "int64 tensor of the global indices at positions [first, first + count) of rank's shard");

  m.def(
      "shard_iter",
      [](std::int64_t n, std::int64_t world, std::int64_t rank, const std::string& mode,
         bool shuffle, std::uint64_t seed, std::uint64_t epoch, std::int64_t first,
         std::int64_t stop) {
        ShardSpec spec = make_spec(n, world, rank, mode, shuffle, seed, epoch);
        ShardIndexer(spec).check_positions(first, stop - first);
        PyObject* it = make_shard_iterator(spec, first, stop);
        if (it == nullptr) throw py::error_already_set();
        return py::reinterpret_steal<py::object>(it);
      },
      py::arg("n"), py::arg("world_size"), py::arg("rank"), py::arg("mode"), py::arg("shuffle"),
      py::arg("seed"), py::arg("epoch"), py::arg("first"), py::arg("stop"),
      "ShardIterator over the global indices at positions [first, stop) of rank's shard");

  m.def(
      "permutation_inverse",
      [](std::int64_t n, std::uint64_t seed, std::uint64_t epoch, const at::Tensor& values) {
        TORCH_CHECK_TYPE(values.scalar_type() == at::kLong && values.device().is_cpu(),
                         "values must be a CPU int64 tensor, got ", values.scalar_type(), " on ",
                         values.device());
        at::Tensor in = values.contiguous();
        at::Tensor out = at::empty_like(in);
        permutation_inverse(n, seed, epoch, in.data_ptr<std::int64_t>(), in.numel(),
                            out.data_ptr<std::int64_t>());
        return out;
      },
      py::arg("n"), py::arg("seed"), py::arg("epoch"), py::arg("values"),
      "Preimages under the (seed, epoch) permutation of [0, n); for tests");
}

}  // namespace fluxmpi
