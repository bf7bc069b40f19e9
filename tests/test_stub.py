"""fluxmpi_py/_C.pyi names exactly the public API of the built fluxmpi_py._C: every public
name of the module and of its classes is in the stub, and every name in the stub exists."""

import ast
import os
import subprocess
import sys

from fluxmpi_py._core import C

STUB = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fluxmpi_py", "_C.pyi"
)


def _public(names):
    return {n for n in names if not n.startswith("_")}


def _defined(body):
    """Names a stub body defines (classes, functions, annotated and plain assignments)."""
    out = {}
    for node in body:
        if isinstance(node, ast.ClassDef):
            out[node.name] = _defined(node.body)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = None
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = None
        elif isinstance(node, ast.Assign):
            out.update({t.id: None for t in node.targets if isinstance(t, ast.Name)})
    return out


def differences(stub_text, module):
    """Lines naming what the module has and the stub lacks, and the reverse."""
    stub = _defined(ast.parse(stub_text).body)
    faults = []
    have, declared = _public(dir(module)), _public(stub)
    faults += [f"{n}: in _C, not in the stub" for n in sorted(have - declared)]
    faults += [f"{n}: in the stub, not in _C" for n in sorted(declared - have)]
    for name in sorted(have & declared):
        obj = getattr(module, name)
        if isinstance(obj, type):
            members, stub_members = _public(vars(obj)), _public(stub[name] or {})
            faults += [
                f"{name}.{m}: in _C, not in the stub" for m in sorted(members - stub_members)
            ]
            faults += [
                f"{name}.{m}: in the stub, not in _C" for m in sorted(stub_members - members)
            ]
    return faults


def test_stub_matches_the_compiled_module():
    with open(STUB) as f:
        assert differences(f.read(), C) == []


def test_a_stale_stub_is_reported():
    with open(STUB) as f:
        text = f.read()
    without = text.replace("def barrier() -> None: ...\n", "")
    assert without != text
    extra = text + "def not_in_the_module() -> None: ...\n"
    member = text.replace("    relocate: bool\n", "    relocate: bool\n    speed: int\n")
    assert differences(without, C) == ["barrier: in _C, not in the stub"]
    assert differences(extra, C) == ["not_in_the_module: in the stub, not in _C"]
    assert differences(member, C) == ["CoalescedOptions.speed: in the stub, not in _C"]


def test_stub_ships_with_the_package(tmp_path):
    # build_py copies what a wheel or an install gets: the stub and the py.typed marker too.
    root = os.path.dirname(os.path.dirname(STUB))
    proc = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_py", "-d", str(tmp_path)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "fluxmpi_py" / "_C.pyi").is_file()
    assert (tmp_path / "fluxmpi_py" / "py.typed").is_file()
