// The ShardIterator type (see shard_iterator.h), written against the CPython C API.
#include "python/shard_iterator.h"

#include <algorithm>
#include <array>
#include <exception>
#include <new>

namespace fluxmpi {
namespace {

// 4 Ki indices (32 KiB) per refill: large enough that the refill call is noise per index,
// small enough to stay in cache. The first refill is smaller so the first index is quick.
constexpr std::int64_t kChunk = 4096;
constexpr std::int64_t kFirstChunk = 256;

struct IterState {
  explicit IterState(const ShardSpec& spec, std::int64_t first, std::int64_t last)
      : indexer(spec), base(first), stop(last) {}

  ShardIndexer indexer;
  std::int64_t base;        // shard position of buf[0]
  std::int64_t stop;        // one past the last position to yield
  std::int64_t cursor = 0;  // next slot of buf to hand out
  std::int64_t filled = 0;  // valid slots in buf
  std::int64_t chunk = kFirstChunk;
  std::array<std::int64_t, kChunk> buf;

  std::int64_t position() const { return base + cursor; }
};

struct ShardIterObject {
  PyObject_HEAD IterState state;  // placement-constructed after allocation, destroyed in dealloc
};

PyTypeObject* g_type = nullptr;

void iter_dealloc(PyObject* self) {
  PyTypeObject* tp = Py_TYPE(self);
  reinterpret_cast<ShardIterObject*>(self)->state.~IterState();
  tp->tp_free(self);
  Py_DECREF(tp);  // instances of heap types own a reference to their type
}

PyObject* iter_next(PyObject* self) {
  IterState& s = reinterpret_cast<ShardIterObject*>(self)->state;
  if (s.cursor == s.filled) {
    const std::int64_t next = s.base + s.filled;
    if (next >= s.stop) return nullptr;  // exhausted: StopIteration without an error set
    const std::int64_t count = std::min(s.chunk, s.stop - next);
    try {
      s.indexer.fill(next, count, s.buf.data());
    } catch (const std::exception& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
      return nullptr;
    }
    s.base = next;
    s.cursor = 0;
    s.filled = count;
    s.chunk = kChunk;
  }
  return PyLong_FromLongLong(s.buf[s.cursor++]);
}

PyObject* iter_position(PyObject* self, void*) {
  return PyLong_FromLongLong(reinterpret_cast<ShardIterObject*>(self)->state.position());
}

PyObject* iter_stop(PyObject* self, void*) {
  return PyLong_FromLongLong(reinterpret_cast<ShardIterObject*>(self)->state.stop);
}

PyObject* iter_length_hint(PyObject* self, PyObject*) {
  const IterState& s = reinterpret_cast<ShardIterObject*>(self)->state;
  return PyLong_FromLongLong(s.stop - s.position());
}

PyGetSetDef iter_getset[] = {
    {"position", iter_position, nullptr, "shard position of the next index", nullptr},
    {"stop", iter_stop, nullptr, "one past the last shard position this iterator yields", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyMethodDef iter_methods[] = {
    {"__length_hint__", iter_length_hint, METH_NOARGS, "indices left"},
    {nullptr, nullptr, 0, nullptr},
};

PyType_Slot iter_slots[] = {
    {Py_tp_dealloc, reinterpret_cast<void*>(iter_dealloc)},
    {Py_tp_iter, reinterpret_cast<void*>(PyObject_SelfIter)},
    {Py_tp_iternext, reinterpret_cast<void*>(iter_next)},
    {Py_tp_getset, iter_getset},
    {Py_tp_methods, iter_methods},
    {Py_tp_doc, const_cast<char*>("Iterator over one rank's shard indices (fluxmpi_py internal).")},
    {0, nullptr},
};

PyType_Spec iter_spec = {
    "fluxmpi_py._C.ShardIterator",
    sizeof(ShardIterObject),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    iter_slots,
};

}  // namespace

bool register_shard_iterator(PyObject* module) {
  PyObject* type = PyType_FromSpec(&iter_spec);
  if (type == nullptr) return false;
  g_type = reinterpret_cast<PyTypeObject*>(type);  // the module keeps it alive from here on
  return PyModule_AddObject(module, "ShardIterator", type) == 0;  // steals `type` on success
}

PyObject* make_shard_iterator(const ShardSpec& spec, std::int64_t first, std::int64_t stop) {
  PyObject* obj = g_type->tp_alloc(g_type, 0);  // increfs the heap type
  if (obj == nullptr) return nullptr;
  try {
    new (&reinterpret_cast<ShardIterObject*>(obj)->state) IterState(spec, first, stop);
  } catch (...) {
    // Not constructed: free the memory without running the destructor.
    PyTypeObject* tp = Py_TYPE(obj);
    tp->tp_free(obj);
    Py_DECREF(tp);
    throw;
  }
  return obj;
}

}  // namespace fluxmpi
