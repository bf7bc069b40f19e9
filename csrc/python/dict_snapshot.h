// CPython dict internals for synchronize_'s cached module walk (fluxmpi_py/_sync_walk.py): is
// a snapshot of dicts still what the dicts hold? Glue at the level of the C API, for speed.
#pragma once

#include <Python.h>

namespace fluxmpi {

// CPython before 3.12 gives every dict a version tag (PEP 509): a new value of a global
// counter on every modification, so an equal tag means an unmodified dict. 3.12 deprecates
// the field; there, and in any later version, -1: no tag, compare the entries. Also -1 for a
// dict subclass (OrderedDict can reorder without touching the dict itself).
long long dict_version(PyObject* d);

// Whether every dict of `snapshot` holds the same key and value objects, in order.
// `snapshot` is a list of (dict, [keys], [values], version) tuples. A dict whose version tag is
// the one recorded was not modified since: one comparison, against one per entry otherwise
// (~25 us for a thousand entries on a cold cache, where the whole call's budget is ~100 us).
// Without a tag (version -1), or when it moved, the entries are compared by identity.
// TypeError (a c10 error) for a malformed snapshot.
bool dicts_unchanged(PyObject* snapshot);

}  // namespace fluxmpi
