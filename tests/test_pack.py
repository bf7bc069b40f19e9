"""The pack plan (csrc/fusion/pack_plan.*) and pack/unpack from it (csrc/ops/bucket_pack.*):
offsets, and every dtype, scale and cast against torch, with odd sizes and unaligned offsets.
Needs no Init. The same cases run on a GPU (marked ``cuda``: the multi-tensor kernel of
csrc/cuda/pack_kernels.cu) where one is present, and skip visibly elsewhere.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import fluxmpi_py._C as C

FLOATS = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.cuda,
            pytest.mark.skipif(
                not torch.cuda.is_available() or not C.compiled_with_cuda(),
                reason="needs a GPU and a CUDA build of fluxmpi_py (scripts/gpu_check.sh)",
            ),
        ],
    ),
]
SIZES = [1, 7, 0, 1023, 8193 * 2 + 5]  # odd, empty, and more than one kernel chunk (8192)


def opmath(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def reference(src, scale, to):
    """torch's (src in its math type) * scale, cast to `to`: what pack and unpack promise."""
    x = src.to(opmath(src.dtype))
    return (x * scale if scale != 1.0 else x).to(to)


def members(dtype, device, gen, sizes=SIZES, unaligned=True):
    """Tensors of `sizes` in `dtype`, each a view starting one element into its storage (an
    unaligned address) when `unaligned`; values span several binades, negative ones too."""
    out = []
    for n in sizes:
        base = torch.randn(n + 1, generator=gen, dtype=torch.float64) * 300
        t = base.to(dtype).to(device)
        out.append(t[1:] if unaligned else t[:n])
    return out


def test_plan_places_members_in_order_at_aligned_offsets():
    ts = [torch.zeros(3), torch.zeros(0, dtype=torch.float16), torch.zeros(5, dtype=torch.float64)]
    plan = C.plan_pack(ts, torch.float16, scales=[0.5, 1.0, 0.25], align=4, unscale=2.0)
    assert plan.wire == torch.float16
    assert [(e["member"], e["offset"], e["numel"], e["dtype"]) for e in plan.entries] == [
        (0, 0, 3, torch.float32),
        (2, 4, 5, torch.float64),
    ]
    assert [(e["scale"], e["unscale"]) for e in plan.entries] == [(0.5, 2.0), (0.25, 2.0)]
    assert plan.numel == 9
    unaligned = C.plan_pack([torch.zeros(3), torch.zeros(2)], torch.float32)
    assert [e["offset"] for e in unaligned.entries] == [0, 3] and unaligned.numel == 5


def test_plan_equals_the_bucket_plans_offsets():
    ts = [torch.zeros(n) for n in (3, 1, 10, 7)]
    (bucket,) = C.plan_buckets(ts, C.PlanOptions(cap_bytes=1 << 20))
    plan = C.plan_pack(ts, torch.float32)
    assert [e["member"] for e in plan.entries] == bucket["members"]
    assert plan.numel == bucket["numel"]


@pytest.mark.parametrize(
    "dtype, wire, scale, unscale",
    [
        (torch.int64, torch.float32, 1.0, 1.0),
        (torch.float32, torch.int32, 1.0, 1.0),
        (torch.int32, torch.int32, 0.5, 1.0),
        (torch.int32, torch.int32, 1.0, 2.0),
    ],
)
def test_plan_refuses_what_cannot_be_cast_or_scaled(dtype, wire, scale, unscale):
    with pytest.raises(ValueError, match=r"member [01] \(.*\) cannot be packed into a buffer of"):
        C.plan_pack(
            [torch.zeros(2, dtype=wire), torch.zeros(2, dtype=dtype)],
            wire,
            scales=[1.0, scale],
            unscale=unscale,
        )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype, wire", list(itertools.product(FLOATS, FLOATS)))
@pytest.mark.parametrize("scale", [1.0, 0.25, 1 / 3])
def test_pack_and_unpack_equal_torch(device, dtype, wire, scale):
    gen = torch.Generator().manual_seed(hash((str(dtype), str(wire), scale)) % 2**31)
    srcs = members(dtype, device, gen)
    # align 3 puts members at odd element offsets of the flat buffer
    plan = C.plan_pack(srcs, wire, scales=[scale] * len(srcs), align=3, unscale=1 / scale)
    flat = torch.full((plan.numel + 2,), 7.0, dtype=wire, device=device)
    C.pack(plan, srcs, flat)
    covered = torch.zeros(flat.numel(), dtype=torch.bool)
    for e in plan.entries:
        got = flat[e["offset"] : e["offset"] + e["numel"]]
        want = reference(srcs[e["member"]], scale, wire)
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
        covered[e["offset"] : e["offset"] + e["numel"]] = True
    assert (flat.cpu()[~covered] == 7).all(), "pack wrote outside its entries"

    outs = [torch.empty_like(s) for s in srcs]
    C.unpack(plan, flat, outs)
    for e in plan.entries:
        slot = flat[e["offset"] : e["offset"] + e["numel"]]
        want = reference(slot, 1 / scale, dtype)
        torch.testing.assert_close(outs[e["member"]], want, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.int64, torch.uint8, torch.bool, torch.complex64])
def test_plain_copies_of_any_dtype(device, dtype):
    srcs = [torch.arange(n + 1).to(dtype).to(device)[1:] for n in (5, 0, 3)]
    plan = C.plan_pack(srcs, dtype, align=2)
    flat = torch.zeros(plan.numel, dtype=dtype, device=device)
    C.pack(plan, srcs, flat)
    assert torch.equal(flat[0:5], srcs[0]) and torch.equal(flat[6:9], srcs[2])
    outs = [torch.zeros_like(s) for s in srcs]
    C.unpack(plan, flat, outs)
    assert all(torch.equal(o, s) for o, s in zip(outs, srcs))


@pytest.mark.parametrize("device", DEVICES)
def test_in_place_member_is_scaled_where_it_lives(device):
    """A gradient that already lives in its slot: pack scales it there."""
    flat = torch.arange(6.0, device=device)
    slots = [flat[0:2], flat[2:6]]
    plan = C.plan_pack(slots, torch.float32, scales=[0.5, 1.0])
    C.pack(plan, slots, flat)
    assert flat.tolist() == [0.0, 0.5, 2.0, 3.0, 4.0, 5.0]


def test_pack_names_the_tensor_that_does_not_fit():
    srcs = [torch.zeros(3), torch.zeros(4)]
    plan = C.plan_pack(srcs, torch.float16)
    flat = torch.zeros(plan.numel, dtype=torch.float16)
    with pytest.raises(
        ValueError, match=r"pack: tensor 1 must be a contiguous float32 tensor of 4"
    ):
        C.pack(plan, [srcs[0], torch.zeros(5)], flat)
    with pytest.raises(ValueError, match=r"unpack: tensor 1 .* not contiguous"):
        C.unpack(plan, flat, [srcs[0], torch.zeros(2, 4)[:, 0:2]])
    with pytest.raises(ValueError, match=r"flat buffer must be a contiguous float16 tensor of at"):
        C.pack(plan, srcs, torch.zeros(plan.numel))
    with pytest.raises(ValueError, match=r"plan has member 1 but 1 tensors"):
        C.pack(plan, srcs[:1], flat)
