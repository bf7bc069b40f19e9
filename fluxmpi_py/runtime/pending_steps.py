"""Steps a rank left half-done, to be completed before its next collective: a backward pass
that raised on this rank after some of its gradient hooks ran (training/_abandoned_pass.py).
The other ranks wait in that step's reduction; were this rank's next call a collective of its
own (an allreduce of the loss, a SyncBatchNorm forward), it would meet theirs and neither would
end. So every collective's entry (``group_dispatch``, and the hot calls, which step aside to it
while anything is pending; ``entry_point``, unless its arguments make the call local) first completes the
pending steps, with the others, and goes on.

``PENDING`` is empty unless a backward pass is open: one truth test a call.
"""

from __future__ import annotations

import weakref
from typing import Any

#: id -> weak reference of each owner with an open backward pass; an owner has
#: ``_settle_before_collective()``
PENDING: dict[int, weakref.ReferenceType[Any]] = {}


def mark_open(owner: Any, open_: bool) -> None:
    """Note whether ``owner`` has a backward pass open."""
    if open_:
        PENDING[id(owner)] = weakref.ref(owner)
    else:
        PENDING.pop(id(owner), None)


def settle_pending() -> None:
    """Complete the steps of the backward passes that raised on this rank (each owner's own
    rule); a pass still running (this call is made inside backward) is left open."""
    for key, ref in list(PENDING.items()):
        owner = ref()
        if owner is None:
            PENDING.pop(key, None)
            continue
        owner._settle_before_collective()
