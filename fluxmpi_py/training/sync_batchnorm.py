"""SyncBatchNorm: batch normalization whose training statistics come from every rank's batch.

N ranks with batch B each normalize, update the running statistics and produce gradients as
one process with batch N*B would. Per forward in training, one allreduce gathers each rank's
per-channel [mean, sum of squared deviations, count] (combined exactly, without the
cancellation of sum-of-squares); per backward, one allreduce of the two per-channel gradient
sums. Eval mode is plain batch norm with the running statistics, without communication.
"""

from __future__ import annotations

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from .._core import C
from ..collectives.inplace import allreduce_
from ..runtime.agreement import mark_raised_on_every_rank, user_call
from ..runtime.entry import entry_point, local_call

__all__ = ["SyncBatchNorm"]


def _stats_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _channel_shape(x: torch.Tensor) -> tuple[int, ...]:
    """The shape that broadcasts a per-channel vector against ``x`` (channels in dim 1)."""
    return (1, -1) + (1,) * (x.dim() - 2)


def _reduce_dims(x: torch.Tensor) -> list[int]:
    return [0] + list(range(2, x.dim()))


def _local_stats(x: torch.Tensor, num_features: int) -> torch.Tensor:
    """This rank's row (1, 2C+1): [mean (C), sum of squared deviations (C), count], in fp32
    (fp64 for fp64 input)."""
    dtype = _stats_dtype(x)
    count = x.numel() // num_features
    if count == 0:  # an empty batch still takes part, with weight 0
        return torch.zeros(1, 2 * num_features + 1, dtype=dtype, device=x.device)
    var, mean = torch.var_mean(x.to(dtype), dim=_reduce_dims(x), correction=0)
    n = torch.full((1,), float(count), dtype=dtype, device=x.device)
    return torch.cat([mean, var * count, n]).unsqueeze(0)


def _global_stats(rows_: torch.Tensor, num_features: int):
    """Every rank's rows combined (Chan et al.): (mean, biased variance, total count)."""
    c = num_features
    means, m2s, counts = rows_[:, :c], rows_[:, c : 2 * c], rows_[:, 2 * c :]
    total = counts.sum()
    mean = (counts * means).sum(0) / total
    m2 = (m2s + counts * (means - mean) ** 2).sum(0)
    return mean, m2 / total, int(total.item())


class _SyncBatchNormFunction(torch.autograd.Function):
    """y = (x - mean) * invstd * weight + bias with global mean/invstd; the backward adds
    the gradient through the global statistics (one allreduce of two per-channel sums)."""

    @staticmethod
    def forward(ctx, x, weight, bias, mean, invstd, total):
        shape = _channel_shape(x)
        xhat = (x.to(mean.dtype) - mean.view(shape)) * invstd.view(shape)
        y = xhat if weight is None else xhat * weight.to(mean.dtype).view(shape)
        if bias is not None:
            y = y + bias.to(mean.dtype).view(shape)
        ctx.save_for_backward(x, weight, mean, invstd)
        ctx.total = total
        ctx.has_bias = bias is not None
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        x, weight, mean, invstd = ctx.saved_tensors
        shape, dims = _channel_shape(x), _reduce_dims(x)
        dy = grad.to(mean.dtype)
        xhat = (x.to(mean.dtype) - mean.view(shape)) * invstd.view(shape)
        sum_dy = dy.sum(dims)
        sum_dy_xhat = (dy * xhat).sum(dims)
        grad_x = grad_w = grad_b = None
        if weight is not None and ctx.needs_input_grad[1]:
            grad_w = sum_dy_xhat.to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = sum_dy.to(weight.dtype if weight is not None else grad.dtype)
        if ctx.needs_input_grad[0]:
            with user_call("SyncBatchNorm backward"):
                sums = allreduce_(torch.cat([sum_dy, sum_dy_xhat]), "sum")
            c = sum_dy.numel()
            g_dy, g_dy_xhat = sums[:c].view(shape), sums[c:].view(shape)
            scale = invstd if weight is None else invstd * weight.to(mean.dtype)
            dx = (dy - g_dy / ctx.total - xhat * (g_dy_xhat / ctx.total)) * scale.view(shape)
            grad_x = dx.to(x.dtype)
        return grad_x, grad_w, grad_b, None, None, None


@local_call  # its forward is the collective
class SyncBatchNorm(_BatchNorm):
    """BatchNorm over the union of every rank's batch, for inputs (B, C, *) of any rank >= 2.

    In training, the mean and variance of each channel are those of all ranks' rows together
    (a rank may have 0 rows: it takes part with count 0 and returns an empty output), the
    running statistics are updated with them (running_var with the unbiased variance of the
    global count), and backward propagates through them. Every rank must run forward (and
    backward) together, all in training mode; a rank that does otherwise makes the next
    collective disagree, which raises on every rank. Eval mode is ``F.batch_norm`` with the
    running statistics (with ``track_running_stats=False``, this rank's batch statistics, as
    torch's SyncBatchNorm), without communication.

    Args:
        num_features: C, the number of channels.
        eps: added to the variance, for numerical stability.
        momentum: the running statistics' update factor; None: a cumulative average.
        affine: True: learnable per-channel weight and bias.
        track_running_stats: True: keep running statistics for eval mode.
        device: where the parameters and buffers are made.
        dtype: their dtype.

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> bn = fm.SyncBatchNorm(3)
    >>> x = torch.arange(12.0).view(4, 3) * (fm.local_rank() + 1)
    >>> y = bn(x)
    >>> allx = torch.cat([torch.arange(12.0).view(4, 3) * (r + 1)
    ...                   for r in range(fm.total_workers())])
    >>> torch.allclose(bn.running_mean, 0.1 * allx.mean(0))
    True
    """

    # torch's BatchNorm arguments, spelled out so that the reference shows them.
    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"SyncBatchNorm expects input of shape (B, C, *), got {input.dim()}D")

    # In training a collective: an error of its checks (a tensor they cannot read) before
    # the statistics' allreduce is this rank's verdict there; in eval, local.
    @entry_point("SyncBatchNorm.forward()", local_if=lambda a: not a["self"].training)
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return super().forward(input)
        error = ""
        if not isinstance(input, torch.Tensor) or input.dim() < 2:
            error = f"SyncBatchNorm expects a tensor (B, C, *), got {_describe(input)}"
        elif input.shape[1] != self.num_features:
            error = (
                f"SyncBatchNorm({self.num_features}) got input of shape {tuple(input.shape)}: "
                f"dim 1 must be {self.num_features}"
            )
        elif not input.is_floating_point():
            error = f"SyncBatchNorm expects a floating input, got {input.dtype}"
        width = 2 * self.num_features + 1
        if error:
            table = torch.zeros(C.size(), width)
        else:
            local = _local_stats(input, self.num_features)
            table = local.new_zeros(C.size(), width)
            table[C.rank()] = local[0]
        # An allgather as a sum of rows that are zero but on their own rank (exact, and on
        # every backend). A local error travels in it, so every rank raises together.
        with torch.no_grad(), user_call("SyncBatchNorm.forward()"):
            C.allreduce_(table, "sum", error)
        mean, var, total = _global_stats(table, self.num_features)
        if total <= 1:
            raise mark_raised_on_every_rank(
                ValueError(
                    f"SyncBatchNorm in training needs more than 1 value per channel over all "
                    f"ranks, got {total} (input shape {tuple(input.shape)} on this rank)"
                )
            )
        self._update_running_stats(mean, var, total)
        invstd = torch.rsqrt(var + self.eps)
        return _SyncBatchNormFunction.apply(input, self.weight, self.bias, mean, invstd, total)

    @torch.no_grad()
    def _update_running_stats(self, mean, var, total):
        if not self.track_running_stats or self.running_mean is None:
            return
        factor = 0.0 if self.momentum is None else self.momentum
        if self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative moving average
                factor = 1.0 / float(self.num_batches_tracked)
        rm, rv = self.running_mean, self.running_var
        rm.mul_(1 - factor).add_(mean.to(rm.dtype), alpha=factor)
        rv.mul_(1 - factor).add_((var * (total / (total - 1))).to(rv.dtype), alpha=factor)

    @classmethod
    @local_call
    def convert_sync_batchnorm(cls, module: torch.nn.Module) -> torch.nn.Module:
        """``module`` with every BatchNorm (any ``_BatchNorm``, nested anywhere) replaced by a
        SyncBatchNorm that keeps its parameters, buffers, momentum, eps and mode. Returns the
        new root (``module`` itself, changed in place, unless it is a BatchNorm).

        Args:
            module: the model (or a single BatchNorm layer) to convert.

        >>> import torch, fluxmpi_py as fm
        >>> m = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.BatchNorm1d(4))
        >>> m = fm.SyncBatchNorm.convert_sync_batchnorm(m)
        >>> type(m[1]).__name__, m[1].num_features
        ('SyncBatchNorm', 4)
        """
        if isinstance(module, _BatchNorm) and not isinstance(module, cls):
            out = cls(
                module.num_features, module.eps, module.momentum, module.affine,
                module.track_running_stats,
            )  # fmt: skip
            if module.affine:
                with torch.no_grad():
                    out.weight = module.weight
                    out.bias = module.bias
            out.running_mean = module.running_mean
            out.running_var = module.running_var
            out.num_batches_tracked = module.num_batches_tracked
            out.train(module.training)
            if hasattr(module, "qconfig"):
                out.qconfig = module.qconfig
            module = out
        for name, child in list(module.named_children()):
            module.add_module(name, cls.convert_sync_batchnorm(child))
        return module


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dim()}D tensor of shape {tuple(value.shape)}"
    return type(value).__name__
