"""The Horovod face, ``import fluxmpi_py.horovod as hvd``: horovod.torch's API on fluxmpi_py.

The implementation lives in ``fluxmpi_py.integrations.horovod``; this module is where users
import it from.

>>> import fluxmpi_py.horovod as hvd; hvd.init(); hvd.size() >= 1
True
"""

from .integrations.horovod import *  # noqa: F403
from .integrations.horovod import __all__  # noqa: F401
