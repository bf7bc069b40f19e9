"""Horovod's compressors (``hvd.Compression.none`` and ``hvd.Compression.fp16``) and the wire
of the fused reduction that each stands for; re-exported by ``_optimizer``, whose
``DistributedOptimizer(compression=)`` takes them."""

from __future__ import annotations

import torch

from ...runtime.entry import local_call

__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor"]


class Compressor:
    """Horovod's compressor interface: ``compress(tensor) -> (tensor, ctx)`` and
    ``decompress(tensor, ctx) -> tensor``. Only :class:`Compression`'s two are understood by
    :func:`DistributedOptimizer`.

    >>> import torch, fluxmpi_py.horovod as hvd
    >>> t, ctx = hvd.Compression.none.compress(torch.ones(1)); hvd.Compression.none.decompress(t, ctx).dtype
    torch.float32
    """

    #: The reducer's compression name for this compressor (None: full precision).
    wire: str | None = None

    @staticmethod
    @local_call
    def compress(tensor):
        return tensor, None

    @staticmethod
    @local_call
    def decompress(tensor, ctx):
        return tensor


class NoneCompressor(Compressor):
    """No compression: gradients travel in their own dtype.

    >>> import torch, fluxmpi_py.horovod as hvd
    >>> hvd.Compression.none.compress(torch.ones(1))[0].dtype
    torch.float32
    """


class FP16Compressor(Compressor):
    """Floating tensors travel as float16 and come back in their own dtype.

    >>> import torch, fluxmpi_py.horovod as hvd
    >>> t, ctx = hvd.Compression.fp16.compress(torch.ones(1)); t.dtype, hvd.Compression.fp16.decompress(t, ctx).dtype
    (torch.float16, torch.float32)
    """

    wire = "fp16"

    @staticmethod
    @local_call
    def compress(tensor):
        if tensor.dtype.is_floating_point:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    @local_call
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)


class Compression:
    """Horovod's ``hvd.Compression.none`` and ``hvd.Compression.fp16``.

    >>> import fluxmpi_py.horovod as hvd; hvd.Compression.fp16.wire
    'fp16'
    """

    none = NoneCompressor
    fp16 = FP16Compressor


def _wire(compression) -> str | None:
    if compression in (NoneCompressor, FP16Compressor) or isinstance(
        compression, (NoneCompressor, FP16Compressor)
    ):
        return compression.wire
    raise ValueError(
        f"hvd.DistributedOptimizer(compression={compression!r}): fluxmpi_py compresses inside "
        "its fused reduction and understands hvd.Compression.none and hvd.Compression.fp16 "
        "(or fluxmpi_py.DistributedOptimizer(compression='bf16'))"
    )
