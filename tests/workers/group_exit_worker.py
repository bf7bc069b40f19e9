"""A member of group [0, 2] leaves while rank 0 waits in a collective on that group: the job
must end non-zero, not hang. Mode "exit": rank 2 returns normally (its exit notice reaches
rank 0's watchdog); mode "kill": rank 2 dies by SIGKILL. Rank 1, outside the group, finishes
normally. Mode "local": as "exit", the group made by its members alone (torch's
use_local_synchronization) after rank 2 made a group of its own, so that the members' next
group indices differ before they agree. Run by tests/test_groups.py at 3 ranks.
"""

import os
import signal
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import fluxmpi_py as fm  # noqa: E402

fm.Init()
mode = sys.argv[1]
r = fm.local_rank()
if mode == "local":
    from fluxmpi_py._core import C

    if r == 2:
        C.new_local_group([2], True, 60.0)
    pair = fm.Group(C.new_local_group([0, 2], True, 60.0)) if r != 1 else [0, 2]
else:
    pair = fm.new_group([0, 2])
if r in pair:
    fm.allreduce_(torch.ones(1), group=pair)  # one group call completed by both members
if r == 0:
    fm.allreduce_(torch.ones(1), group=pair)  # rank 2 never joins
    os.write(1, b"the group collective returned\n")
elif r == 2 and mode == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
