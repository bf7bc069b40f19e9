// A CPython iterator over one rank's shard: the indices come from C++ in chunks into a small
// buffer and are handed out one Python int at a time by tp_iternext, with no Python frame
// per index. A generator or pybind11 __next__ would cost more per index than the index math.
#pragma once

#include <Python.h>

#include <cstdint>

#include "ops/shard.h"

namespace fluxmpi {

// Creates the iterator type and adds it to `module` as ShardIterator; call once.
// Returns false with a Python error set on failure.
bool register_shard_iterator(PyObject* module);

// New reference to an iterator over positions [first, stop) of `spec`'s shard, or nullptr
// with a Python error set. Its `position` attribute is the position of the next index, so a
// sampler can report exactly how far its consumer got.
PyObject* make_shard_iterator(const ShardSpec& spec, std::int64_t first, std::int64_t stop);

}  // namespace fluxmpi
