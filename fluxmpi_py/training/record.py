"""record_step: the per-step digests that ``python -m fluxmpi_py.reproduce`` compares.

``python -m fluxmpi_py.reproduce train.py --ranks 1,2,4 --steps N`` (fluxmpi_py/reproduce.py)
runs the script once per world size with ``FLUXMPI_REPRODUCE_DIR`` set to a folder of that run.
There ``record_step(obj)``, called by the script after each step, has rank 0 append one line
to ``steps.jsonl``: a 64-bit digest of every tensor and plain value of ``obj`` by its path
(the names of :func:`check_consistency`: ``model.fc.weight``,
``optimizer.state[fc.weight].exp_avg``); at the N-th step it also saves the tensors
(``final.pt``) and ends the script on every rank (``SystemExit(0)``). Without that variable
(any ordinary run) it does nothing. It makes no collective.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch

from .._core import C
from ..runtime.agreement import hash64
from ..runtime.entry import local_call
from .consistency import _describe, _parameter_names, _Walk

__all__ = ["record_step"]

DIR_ENV = "FLUXMPI_REPRODUCE_DIR"  # the run's folder: recording is on
STEPS_ENV = "FLUXMPI_REPRODUCE_STEPS"  # the step that ends the run (0: the script's end)
STEPS_FILE = "steps.jsonl"  # a header line, then one line per step
FINAL_FILE = "final.pt"  # {path: tensor} after the last recorded step

_recorded = 0  # steps recorded by this process


def _entries(obj: Any) -> list[tuple[str, Any]]:
    walk = _Walk(_parameter_names(obj))
    walk.visit(obj, "")
    return walk.entries


@local_call
def record_step(obj: Any) -> None:
    """Under ``python -m fluxmpi_py.reproduce``, record this step of ``obj`` (a model, an
    optimizer, a scheduler, or dicts and lists of them, as :func:`check_consistency` takes);
    elsewhere do nothing. Call it on every rank after each ``step()``: rank 0 writes the
    digests of every tensor and value (no collective), and the step given by ``--steps``
    ends the script on every rank.

    Args:
        obj: what to record: a model, an optimizer, a scheduler, or dicts and lists of them.

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> model = torch.nn.Linear(4, 2)
    >>> opt = fm.DistributedOptimizer(torch.optim.AdamW(model.parameters()), deterministic=True)
    >>> model(torch.randn(8, 4)).sum().backward()
    >>> opt.step()
    >>> fm.record_step({"model": model, "optimizer": opt})  # a no-op outside the tool
    """
    global _recorded
    out = os.environ.get(DIR_ENV)
    if not out:
        return
    _recorded += 1
    last = int(os.environ.get(STEPS_ENV) or 0)
    if C.rank() == 0:
        entries = _entries(obj)
        tensors = [x for _, x in entries if isinstance(x, torch.Tensor)]
        digests = iter(C.tensor_digests(tensors))
        mine: dict[str, str] = {}
        for path, x in entries:
            # the description (shape, dtype) is part of the digest: equal bytes of another
            # shape are a difference too
            d = next(digests) if isinstance(x, torch.Tensor) else x.text
            mine[path] = f"{hash64(f'{_describe((path, x))}={d}'):016x}"
        line = {"step": _recorded, "digests": mine}
        with open(os.path.join(out, STEPS_FILE), "a") as f:
            if _recorded == 1:
                head = {"world": C.size(), "threads": torch.get_num_threads(), "argv": sys.argv}
                f.write(json.dumps(head) + "\n")
            f.write(json.dumps(line) + "\n")
        if _recorded == last:
            final = {p: x.detach().cpu().clone() for p, x in entries if isinstance(x, torch.Tensor)}
            torch.save(final, os.path.join(out, FINAL_FILE))
    if _recorded == last:
        raise SystemExit(0)
