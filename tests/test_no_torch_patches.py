"""fluxmpi_py reaches torch through its public extension points only: no module of the package
assigns into a torch module or class (an attribute, an item, ``setattr``) or reads torch's
process-group registry (``_world``). A static scan of the source (ast), so it also covers
code that no test runs; ``test_the_scan_finds_*`` show that it can fail."""

from __future__ import annotations

import ast
import os
import textwrap

import pytest

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fluxmpi_py")
REGISTRY = {"_world", "pg_map", "pg_group_ranks", "_rendezvous_handlers"}


def _is_module_import(node: ast.AST) -> bool:
    """``importlib.import_module(...)`` or ``__import__(...)``, whatever it names."""
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    return name in ("import_module", "__import__")


class _TorchNames(ast.NodeVisitor):
    """The names a module binds to torch's modules, classes or their attributes: imports of
    torch, and (to a fixed point) names assigned from an expression rooted in one, such as
    ``c10d = importlib.import_module("torch.distributed.distributed_c10d")`` or
    ``handlers = c10d._rendezvous_handlers``. A call's result (a tensor) is not one."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.aliases: list[tuple[str, ast.AST]] = []

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            if a.name.split(".")[0] == "torch":
                self.names.add(a.asname or "torch")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level == 0 and (node.module or "").split(".")[0] == "torch":
            self.names.update(a.asname or a.name for a in node.names)

    def visit_Assign(self, node: ast.Assign) -> None:
        for t in node.targets:
            if isinstance(t, ast.Name):
                self.aliases.append((t.id, node.value))
        self.generic_visit(node)


def _root(node: ast.AST) -> ast.AST:
    """The expression an attribute/item chain starts from: ``a`` of ``a.b[c].d``."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node


def _rooted_in_torch(node: ast.AST, names: set[str]) -> bool:
    base = _root(node)
    if isinstance(base, ast.Name):
        return base.id in names
    return _is_module_import(base)


def torch_patches(source: str, filename: str = "<source>") -> list[str]:
    """Each assignment into torch in ``source`` (and each read of its group registry), as
    'file:line: text'."""
    tree = ast.parse(source)
    finder = _TorchNames()
    finder.visit(tree)
    names = set(finder.names)
    changed = True
    while changed:
        changed = False
        for name, value in finder.aliases:
            rooted = isinstance(value, (ast.Attribute, ast.Subscript, ast.Name))
            if name not in names and (
                (rooted and _rooted_in_torch(value, names)) or _is_module_import(value)
            ):
                names.add(name)
                changed = True
    found = []

    def report(node: ast.AST, why: str) -> None:
        found.append(f"{filename}:{node.lineno}: {why}: {ast.get_source_segment(source, node)}")

    for node in ast.walk(tree):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        for t in targets:
            for sub in ast.walk(t) if isinstance(t, (ast.Tuple, ast.List)) else [t]:
                if isinstance(sub, (ast.Attribute, ast.Subscript)) and _rooted_in_torch(sub, names):
                    report(node, "assignment into torch")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in ("setattr", "delattr") and node.args:
                if _rooted_in_torch(node.args[0], names):
                    report(node, f"{node.func.id} on torch")
        if isinstance(node, ast.Attribute) and node.attr in REGISTRY:
            if _rooted_in_torch(node, names):
                report(node, "torch's private registry")
    return found


def _package_files() -> list[str]:
    out = []
    for top, _, files in os.walk(PACKAGE):
        out += [os.path.join(top, f) for f in files if f.endswith(".py")]
    return sorted(out)


def test_no_module_of_the_package_patches_torch():
    files = _package_files()
    assert len(files) > 20, files  # the scan sees the package
    found = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            found += torch_patches(f.read(), os.path.relpath(path, os.path.dirname(PACKAGE)))
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    "source",
    [
        # the forms fluxmpi_py/c10d.py and _dataloader_check.py used before issue 32
        """
        from torch.utils.data import DataLoader
        def install(wrapper):
            DataLoader.__init__ = wrapper
        """,
        """
        import importlib
        c10d = importlib.import_module("torch.distributed.distributed_c10d")
        c10d._new_group_with_tag = lambda *a: None
        """,
        """
        import importlib
        handlers = importlib.import_module("torch.distributed.rendezvous").handlers
        handlers["env"] = print
        """,
        """
        import importlib
        for m in ("torch.distributed", "torch.distributed.device_mesh"):
            importlib.import_module(m).split_group = print
        """,
        """
        import torch.distributed as dist
        def ranks(pg):
            return dist.distributed_c10d._world.pg_group_ranks[pg]
        """,
        "import torch\ntorch.nn.Module.forward = print\n",
        "import torch as t\nsetattr(t.optim.SGD, 'step', print)\n",
        "from torch import nn\nnn.Linear.extra_repr, x = print, 1\n",
    ],
)
def test_the_scan_finds_a_patch(source):
    assert torch_patches(textwrap.dedent(source)), source


def test_the_scan_leaves_tensors_and_our_own_objects_alone():
    source = """
    import torch
    import torch.distributed as dist
    t = torch.zeros(3)
    t[0] = 1
    t[1:] += 2
    class Data:
        _world = 2
    self_world = Data()._world
    class Mine(torch.nn.Module):
        pass
    Mine.flag = True
    def f():
        pass
    f._marker = True
    dist.Backend.register_backend("x", f)
    """
    assert torch_patches(textwrap.dedent(source)) == []
