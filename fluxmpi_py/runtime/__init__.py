"""The runtime: Init and the world, groups, printing, preferences, stall settings, launch and logs."""

# Each public module writes its names once, in its own __all__; the star imports re-export
# them. mypy reads a star import's names as public where the module has no __all__ it can
# read, and a computed one it reads as empty: so it is computed where mypy does not look.
import typing as _typing

from . import elastic as _elastic
from . import groups as _groups
from . import launch as _launch
from . import logs as _logs
from . import preferences as _preferences
from . import printing as _printing
from . import stop as _stop
from . import world as _world
from .elastic import *  # noqa: F403
from .groups import *  # noqa: F403
from .launch import *  # noqa: F403
from .logs import *  # noqa: F403
from .preferences import *  # noqa: F403
from .printing import *  # noqa: F403
from .stop import *  # noqa: F403
from .world import *  # noqa: F403

if not _typing.TYPE_CHECKING:
    __all__ = [
        *_world.__all__,
        *_stop.__all__,
        *_elastic.__all__,
        *_groups.__all__,
        *_printing.__all__,
        *_preferences.__all__,
        *_launch.__all__,
        *_logs.__all__,
    ]
