"""A second Init: what only the first call applies (gpu_devices, comm, verbose=True) is not
dropped in silence but named in a warning; what a second call applies (timeout, stall_warning,
debug, flight_dir) is applied without one (fluxmpi_py/runtime/world.py)."""

import json

SECOND_CALLS = r"""
import json, warnings, fluxmpi_py as fm
from fluxmpi_py._core import C
fm.Init()
found = {}
for kwargs in ({}, {"verbose": True}, {"gpu_devices": [0]}, {"timeout": 30},
               {"stall_warning": 5, "debug": "off"}, {"verbose": False}):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        fm.Init(**kwargs)
    found[json.dumps(kwargs)] = [str(x.message) for x in w]
found["stall"] = list(C.stall_settings())
print("RESULT " + json.dumps(found))
"""


def test_a_second_init_says_what_it_does_not_apply(forked, tmp_path):
    p = forked.run(SECOND_CALLS, cwd=tmp_path, timeout=120)
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    assert p.returncode == 0 and line, p.stdout + p.stderr
    found = json.loads(line[-1][len("RESULT ") :])
    for quiet in ({}, {"timeout": 30}, {"stall_warning": 5, "debug": "off"}, {"verbose": False}):
        assert found[json.dumps(quiet)] == [], (quiet, found)
    for asked, shown in (
        ({"verbose": True}, "verbose=True"),
        ({"gpu_devices": [0]}, "gpu_devices=[0]"),
    ):
        (message,) = found[json.dumps(asked)]
        assert message.startswith(f"Init({shown}): fluxmpi_py is already started"), message
        assert "only the first Init applies" in message, message
    assert found["stall"] == [5.0, 30.0]  # the second calls' settings took effect
