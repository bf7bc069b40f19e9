#include "python/dict_snapshot.h"

#include <c10/util/Exception.h>

namespace fluxmpi {

long long dict_version(PyObject* d) {
#if PY_VERSION_HEX < 0x030C0000
  if (!PyDict_CheckExact(d)) return -1;
  return static_cast<long long>(reinterpret_cast<PyDictObject*>(d)->ma_version_tag &
                                0x7fffffffffffffffull);
#else
  (void)d;
  return -1;
#endif
}

bool dicts_unchanged(PyObject* snap) {
  TORCH_CHECK_TYPE(PyList_Check(snap), "dicts_unchanged takes a list");
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(snap); ++i) {
    PyObject* t = PyList_GET_ITEM(snap, i);
    TORCH_CHECK_TYPE(PyTuple_Check(t) && PyTuple_GET_SIZE(t) == 4, "bad snapshot entry");
    PyObject* d = PyTuple_GET_ITEM(t, 0);
    PyObject* keys = PyTuple_GET_ITEM(t, 1);
    PyObject* values = PyTuple_GET_ITEM(t, 2);
    TORCH_CHECK_TYPE(PyDict_Check(d) && PyList_Check(keys) && PyList_Check(values) &&
                         PyList_GET_SIZE(keys) == PyList_GET_SIZE(values) &&
                         PyLong_Check(PyTuple_GET_ITEM(t, 3)),
                     "bad snapshot entry");
    const long long version = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 3));
    if (version >= 0 && version == dict_version(d)) continue;
    if (PyDict_GET_SIZE(d) != PyList_GET_SIZE(keys)) return false;
    Py_ssize_t pos = 0, k = 0;
    PyObject *key = nullptr, *value = nullptr;
    while (PyDict_Next(d, &pos, &key, &value)) {
      if (k >= PyList_GET_SIZE(keys) || key != PyList_GET_ITEM(keys, k) ||
          value != PyList_GET_ITEM(values, k)) {
        return false;
      }
      ++k;
    }
  }
  return true;
}

}  // namespace fluxmpi
