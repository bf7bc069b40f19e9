"""A member of group [0, 2] leaves while rank 0 waits in a collective on that group: the job
must end non-zero, not hang. Mode "exit": rank 2 returns normally (its exit notice reaches
rank 0's watchdog); mode "kill": rank 2 dies by SIGKILL. Rank 1, outside the group, finishes
normally. Run by tests/test_groups.py at 3 ranks.
"""

import os
import signal
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import fluxmpi_py as fm  # noqa: E402

fm.Init()
mode = sys.argv[1]
pair = fm.new_group([0, 2])
r = fm.local_rank()
if r in pair:
    fm.allreduce_(torch.ones(1), group=pair)  # one group call completed by both members
if r == 0:
    fm.allreduce_(torch.ones(1), group=pair)  # rank 2 never joins
    os.write(1, b"the group collective returned\n")
elif r == 2 and mode == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
