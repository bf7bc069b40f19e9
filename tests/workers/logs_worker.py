"""Logging with the rank, before and after Init; run by tests/test_logs.py (output checked)."""

import logging
import sys

import fluxmpi_py as fm

fmt = "[%(rank)s / %(world_size)s] %(levelname)s %(message)s"
log = fm.get_logger("worker", fmt=fmt, stream=sys.stdout)
log.info("before init")  # rank from the launcher's environment
fm.Init()
log.info("after init")
log.debug("hidden at INFO")
root_only = fm.get_logger("worker.root", ranks=0, fmt=fmt, stream=sys.stdout)
root_only.warning("only rank 0")
fm.get_logger("worker.root", ranks=0, fmt=fmt, stream=sys.stdout)  # again: still one handler
root_only.warning("once")
# A user's own handler with the filter.
h = logging.StreamHandler(sys.stdout)
h.addFilter(fm.RankFilter(ranks=[fm.total_workers() - 1]))
h.setFormatter(logging.Formatter("custom rank=%(rank)s %(message)s"))
own = logging.getLogger("worker.own")
own.addHandler(h)
own.propagate = False
own.error("last rank")
