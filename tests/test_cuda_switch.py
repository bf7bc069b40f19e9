"""The CUDA switch, checked where no GPU exists: which sources a build picks, that CPU sources
never reach CUDA headers outside ``#ifdef FLUXMPI_WITH_CUDA``, what build_info reports, and
the NCCL backend's dtype/op lowering (csrc/cuda/nccl_lowering.h, pure C++ compiled here
with the host compiler), replayed with torch on CPU against the MPI path's semantics.
"""

import ast
import functools
import glob
import os
import re
import shutil
import subprocess

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "csrc")


def _setup_function(name, namespace):
    """Load setup.py's top-level functions without running setup() (which builds); return one."""
    tree = ast.parse(open(os.path.join(ROOT, "setup.py")).read())
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    exec(compile(ast.Module(body=fns, type_ignores=[]), "setup.py", "exec"), namespace)
    return namespace[name]


def _touch(root, rel):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "w").close()


def test_sources_selection_rule(tmp_path, monkeypatch):
    sources = _setup_function("sources", {"glob": glob, "os": os})
    for rel in [
        "csrc/bindings.cpp",
        "csrc/ops/pack.cpp",
        "csrc/ops/pack_cuda.cpp",
        "csrc/cuda/nccl_comm.cpp",
        "csrc/fusion/kernel.cu",
        "csrc/cuda/x.h",
    ]:
        _touch(tmp_path, rel)
    monkeypatch.chdir(tmp_path)
    cpu = sources(False)
    assert cpu == ["csrc/bindings.cpp", "csrc/ops/pack.cpp"]
    gpu = sources(True)
    assert gpu[:2] == cpu  # the CPU sources are shared, unchanged, by the CUDA build
    assert sorted(gpu[2:]) == [
        "csrc/cuda/nccl_comm.cpp",
        "csrc/fusion/kernel.cu",
        "csrc/ops/pack_cuda.cpp",
    ]


def test_repo_sources_cpu_build_has_no_cuda_file(monkeypatch):
    sources = _setup_function("sources", {"glob": glob, "os": os})
    monkeypatch.chdir(ROOT)
    cpu = sources(False)
    assert cpu and all(s.endswith(".cpp") for s in cpu)
    assert not [s for s in cpu if s.endswith("_cuda.cpp") or "/cuda/" in s or s.endswith(".cu")]
    gpu = set(sources(True)) - set(cpu)
    assert "csrc/cuda/nccl_backend_cuda.cpp" in gpu and "csrc/cuda/nccl_comm.cpp" in gpu


def test_cuda_switch_off_by_env_and_on_cpu_torch(monkeypatch):
    from torch.utils import cpp_extension

    want_cuda = _setup_function(
        "want_cuda",
        {"os": os, "glob": glob, "shutil": shutil, "torch": torch, "cpp_extension": cpp_extension},
    )
    monkeypatch.setenv("FLUXMPI_PY_WITH_CUDA", "0")
    assert not want_cuda()
    monkeypatch.delenv("FLUXMPI_PY_WITH_CUDA")
    if torch.version.cuda is None:
        assert not want_cuda()


CUDA_ONLY_INCLUDE = re.compile(
    r'#\s*include\s*[<"](cuda[_a-z0-9]*\.h|nccl\.h|c10/cuda/|ATen/cuda/|cuda/|backend/nccl_backend\.h)'
)


def _is_cuda_only(path):
    rel = os.path.relpath(path, ROOT)
    return "/cuda/" in rel or rel.endswith(("_cuda.cpp", "_cuda.h", ".cu", ".cuh"))


def test_cpu_sources_reach_cuda_headers_only_behind_the_switch():
    bad = []
    for path in sorted(glob.glob(os.path.join(CSRC, "**", "*.*"), recursive=True)):
        if not path.endswith((".cpp", ".h")) or _is_cuda_only(path):
            continue
        guarded = []  # one flag per open #if: True when it is #ifdef FLUXMPI_WITH_CUDA
        for n, line in enumerate(open(path), 1):
            s = line.strip()
            if s.startswith("#if"):
                guarded.append(
                    bool(
                        re.match(r"#\s*ifdef\s+FLUXMPI_WITH_CUDA\b", s)
                        or re.match(r"#\s*if\s+defined\(FLUXMPI_WITH_CUDA\)", s)
                    )
                )
            elif s.startswith("#endif") and guarded:
                guarded.pop()
            elif CUDA_ONLY_INCLUDE.match(s) and not any(guarded):
                bad.append(f"{os.path.relpath(path, ROOT)}:{n}: {s}")
    assert not bad, "CUDA headers included outside #ifdef FLUXMPI_WITH_CUDA:\n" + "\n".join(bad)


def test_build_info_matches_the_build():
    import fluxmpi_py as fm

    info = fm.build_info()
    assert info["compiled_with_cuda"] == (info["nccl"] is not None), info
    if info["compiled_with_cuda"]:
        assert re.fullmatch(r"\d+\.\d+\.\d+", info["nccl"]), info
    if torch.version.cuda is None:
        assert info["compiled_with_cuda"] is False, info


# --- the NCCL lowering, compiled with the host compiler and replayed on CPU -------------------

DTYPES = {  # c10::ScalarType codes, as in c10/core/ScalarType.h
    torch.uint8: 0,
    torch.int8: 1,
    torch.int16: 2,
    torch.int32: 3,
    torch.int64: 4,
    torch.float16: 5,
    torch.float32: 6,
    torch.float64: 7,
    torch.bool: 11,
    torch.bfloat16: 15,
}
CODE_TO_DTYPE = {v: k for k, v in DTYPES.items()}
OPS = {"sum": 0, "min": 1, "max": 2, "prod": 3}  # fluxmpi::ReduceOp
MOVES = ("native", "reinterpret", "convert")

PROBE = r"""
#include <cstdio>
#include "cuda/nccl_lowering.h"
using fluxmpi::ReduceOp;
using namespace fluxmpi::nccl;
// compile-time checks of the rules that matter most
static_assert(reduction_plan(c10::kBool, ReduceOp::Sum)->op == ReduceOp::Max);
static_assert(reduction_plan(c10::kBool, ReduceOp::Prod)->op == ReduceOp::Min);
static_assert(reduction_plan(c10::kHalf, ReduceOp::Sum)->wire == c10::kFloat);
static_assert(reduction_plan(c10::kHalf, ReduceOp::Max)->move == Move::Native);
static_assert(!reduction_plan(c10::kFloat, ReduceOp::Average).has_value());
static_assert(!reduction_plan(c10::kComplexFloat, ReduceOp::Sum).has_value());
// 16 bits on the wire when the caller accepts them (compressed buckets): native, no temporary.
static_assert(wire16_plan(c10::kHalf, ReduceOp::Sum)->wire == c10::kHalf);
static_assert(wire16_plan(c10::kBFloat16, ReduceOp::Sum)->move == Move::Native);
static_assert(wire16_plan(c10::kFloat, ReduceOp::Sum)->wire == c10::kFloat);
static_assert(wire16_plan(c10::kBool, ReduceOp::Sum)->move == Move::Reinterpret);
static_assert(!wire16_plan(c10::kHalf, ReduceOp::Average).has_value());
int main() {
  const int dtypes[] = {DTYPES};
  for (int d : dtypes)
    for (int o = 0; o < 4; ++o) {
      auto p = reduction_plan(static_cast<c10::ScalarType>(d), static_cast<ReduceOp>(o));
      if (p) std::printf("%d %d %d %d %d\n", d, o, static_cast<int>(p->wire),
                         static_cast<int>(p->op), static_cast<int>(p->move));
      else std::printf("%d %d none\n", d, o);
    }
}
"""


@pytest.fixture(scope="module")
def lowering_table(tmp_path_factory):
    cxx = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    d = tmp_path_factory.mktemp("lowering")
    src = d / "probe.cpp"
    src.write_text(PROBE.replace("DTYPES", ", ".join(str(v) for v in DTYPES.values())))
    inc = os.path.join(os.path.dirname(torch.__file__), "include")
    exe = d / "probe"
    r = subprocess.run(
        [cxx, "-std=c++20", "-O0", "-I", CSRC, "-I", inc, str(src), "-o", str(exe)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    table = {}
    for row in out.strip().splitlines():
        f = row.split()
        key = (CODE_TO_DTYPE[int(f[0])], int(f[1]))
        table[key] = (
            None if f[2] == "none" else (CODE_TO_DTYPE[int(f[2])], int(f[3]), MOVES[int(f[4])])
        )
    return table


def _nccl_emulated(xs, plan):
    """What the CUDA code does, on CPU: to the wire dtype, reduce as NCCL does (one rank's
    buffer combined into the running result at a time, each step rounded in the wire dtype),
    then back to the caller's dtype."""
    wire, op, move = plan
    if move == "convert":
        ws = [x.to(wire) for x in xs]
    elif move == "reinterpret":
        ws = [x.view(wire) for x in xs]
    else:
        ws = xs
    combine = {
        OPS["sum"]: torch.add,
        OPS["prod"]: torch.mul,
        OPS["min"]: torch.minimum,
        OPS["max"]: torch.maximum,
    }[op]
    r = functools.reduce(combine, ws)
    assert r.dtype == wire
    return r.view(xs[0].dtype) if move == "reinterpret" else r.to(xs[0].dtype)


def _mpi_reference(xs, opname):
    """The MPI path's semantics in closed form (exact integers, one rounding for floats)."""
    dt = xs[0].dtype
    if dt == torch.bool:
        s = torch.stack(xs)
        return s.any(0) if opname in ("sum", "max") else s.all(0)
    if dt.is_floating_point:
        s = torch.stack([x.double() for x in xs])
    else:  # wrap modulo 2^bits, as fixed-width integer arithmetic does
        s = torch.stack([x.long() for x in xs])
    r = {
        "sum": lambda: s.sum(0),
        "prod": lambda: s.prod(0),
        "min": lambda: s.amin(0),
        "max": lambda: s.amax(0),
    }[opname]()
    if not dt.is_floating_point and dt != torch.int64:  # int64 arithmetic already wraps
        bits = torch.iinfo(dt).bits
        r = r & ((1 << bits) - 1)
        if torch.iinfo(dt).min < 0:
            r = torch.where(r >= (1 << (bits - 1)), r - (1 << bits), r)
    return r.to(dt)


def _inputs(dt, world):
    g = torch.Generator().manual_seed(world * 31 + DTYPES[dt])
    if dt == torch.bool:
        return [torch.rand(64, generator=g) < 0.5 for _ in range(world)]
    if dt == torch.float16:  # 2048 + 1 + 1: a 16-bit accumulator would lose both ones
        return [
            torch.tensor([2048.0 if r == 0 else 1.0, r + 0.5, -r], dtype=dt) for r in range(world)
        ]
    if dt == torch.bfloat16:  # same at 256, where bfloat16's spacing is 2
        return [
            torch.tensor([256.0 if r == 0 else 1.0, r + 0.5, -r], dtype=dt) for r in range(world)
        ]
    if dt.is_floating_point:
        return [torch.randn(64, generator=g, dtype=torch.float64).to(dt) for _ in range(world)]
    lo, hi = (
        (-(1 << 40), 1 << 40) if dt == torch.int64 else (torch.iinfo(dt).min, torch.iinfo(dt).max)
    )
    # large magnitudes so that sums and products wrap
    return [
        torch.randint(lo, hi, (64,), generator=g, dtype=torch.int64).to(dt) for _ in range(world)
    ]


@pytest.mark.parametrize("world", [2, 3, 5])
@pytest.mark.parametrize("opname", list(OPS))
@pytest.mark.parametrize("dt", list(DTYPES), ids=str)
def test_nccl_lowering_matches_mpi_semantics(lowering_table, dt, opname, world):
    plan = lowering_table[(dt, OPS[opname])]
    assert plan is not None, f"the NCCL backend cannot reduce {dt} with {opname}"
    wire, op, move = plan
    assert wire in (
        torch.int8,
        torch.uint8,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
    ), "NCCL has no such type"
    xs = _inputs(dt, world)
    got = _nccl_emulated(xs, plan)
    want = _mpi_reference(xs, opname)
    assert got.dtype == dt
    if dt in (torch.float32, torch.float64):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    elif dt == torch.bool:  # the raw bytes too: a bool tensor must hold only 0 and 1
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), (opname, world, got)
    else:  # integers, and 16-bit floats (fp32 accumulation, one rounding) are exact
        assert torch.equal(got, want), (dt, opname, world, got, want)
