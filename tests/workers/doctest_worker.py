"""Run the docstring examples of the modules named on the command line, on every rank."""

import doctest
import importlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import fluxmpi_py as fm  # noqa: E402

fm.Init()
failed = 0
for name in sys.argv[1:]:
    m = importlib.import_module(name)
    res = doctest.testmod(m, optionflags=doctest.ELLIPSIS)
    failed += res.failed
    missing = [
        n
        for n in m.__all__
        if callable(getattr(m, n)) and ">>>" not in (getattr(m, n).__doc__ or "")
    ]
    assert not missing, f"no example in the docstring of {missing}"
    assert res.attempted > 0, f"{name}: no examples ran"
assert failed == 0, f"{failed} docstring examples failed on rank {fm.local_rank()}"
fm.barrier()
if fm.local_rank() == 0:
    print(f"doctests passed on {fm.total_workers()} ranks", flush=True)
