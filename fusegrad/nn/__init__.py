"""Neural-network layers (docs/api.md, Layers): plain classes whose Tensor attributes are the parameters.

Initializations follow torch's defaults so a model trains like its torch twin; optim, state and datasets live in the
submodules."""

from __future__ import annotations
import math
from typing import Sequence
from fusegrad.dtype import dtypes
from fusegrad.helpers import TRAINING, prod
from fusegrad.tensor import Tensor
from fusegrad.tensor_ops.indexing import check_index_bounds, gather_rows


def _training() -> bool:
    return bool(TRAINING) or Tensor.training


def _tuple(x: int | Sequence[int], n: int) -> tuple[int, ...]:
    return (x,) * n if isinstance(x, int) else tuple(x)


def _normalize(x: Tensor, axes: tuple[int, ...], eps: float) -> Tensor:
    mean = x.mean(axis=axes, keepdim=True)
    centered = x - mean
    return centered * ((centered * centered).mean(axis=axes, keepdim=True) + eps).rsqrt()


def _channel_affine(x: Tensor, weight: Tensor | None, bias: Tensor | None) -> Tensor:
    """Per-channel scale and shift of an (N, C, ...) tensor, when the layer has them."""
    if weight is None or bias is None:
        return x
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return x * weight.reshape(shape) + bias.reshape(shape)


class Linear:
    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        bound = 1 / math.sqrt(in_features)
        self.weight = Tensor.uniform(out_features, in_features, low=-bound, high=bound)
        self.bias = Tensor.uniform(out_features, low=-bound, high=bound) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        out = x @ self.weight.T
        return out + self.bias if self.bias is not None else out


class Conv2d:
    """Convolution over any number of spatial dims (an int kernel_size means 2-D)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: int | Sequence[int] | str = 0,
        dilation: int | Sequence[int] = 1,
        groups: int = 1,
        bias: bool = True,
    ):
        self.kernel_size = _tuple(kernel_size, 2)
        if isinstance(padding, str):
            if padding != "same":
                raise ValueError(f"padding string must be 'same', got {padding!r}")
            if any(s != 1 for s in _tuple(stride, len(self.kernel_size))):
                raise ValueError("padding='same' needs stride 1")
            d = _tuple(dilation, len(self.kernel_size))
            total = [di * (k - 1) for di, k in zip(d, self.kernel_size)]
            padding = [p for t in reversed(total) for p in (t // 2, t - t // 2)]
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
        if in_channels % groups or out_channels % groups:
            raise ValueError(
                f"in_channels {in_channels} and out_channels {out_channels} must be divisible by groups {groups}"
            )
        bound = 1 / math.sqrt(in_channels // groups * prod(self.kernel_size))
        self.weight = Tensor.uniform(out_channels, in_channels // groups, *self.kernel_size, low=-bound, high=bound)
        self.bias = Tensor.uniform(out_channels, low=-bound, high=bound) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        return x.conv2d(
            self.weight, self.bias, groups=self.groups, stride=self.stride, dilation=self.dilation, padding=self.padding
        )


def Conv1d(
    in_channels: int,
    out_channels: int,
    kernel_size: int,
    stride: int = 1,
    padding: int | str = 0,
    dilation: int = 1,
    groups: int = 1,
    bias: bool = True,
) -> Conv2d:
    return Conv2d(in_channels, out_channels, (kernel_size,), stride, padding, dilation, groups, bias)


class ConvTranspose2d(Conv2d):
    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: int | Sequence[int] = 0,
        output_padding: int | Sequence[int] = 0,
        dilation: int | Sequence[int] = 1,
        groups: int = 1,
        bias: bool = True,
    ):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias)
        self.output_padding = output_padding
        bound = 1 / math.sqrt(out_channels // groups * prod(self.kernel_size))
        self.weight = Tensor.uniform(in_channels, out_channels // groups, *self.kernel_size, low=-bound, high=bound)
        self.bias = Tensor.uniform(out_channels, low=-bound, high=bound) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        return x.conv_transpose2d(
            self.weight,
            self.bias,
            groups=self.groups,
            stride=self.stride,
            dilation=self.dilation,
            padding=self.padding,
            output_padding=self.output_padding,
        )


def ConvTranspose1d(
    in_channels: int,
    out_channels: int,
    kernel_size: int,
    stride: int = 1,
    padding: int = 0,
    output_padding: int = 0,
    dilation: int = 1,
    groups: int = 1,
    bias: bool = True,
) -> ConvTranspose2d:
    return ConvTranspose2d(
        in_channels, out_channels, (kernel_size,), stride, padding, output_padding, dilation, groups, bias
    )


class BatchNorm:
    """Normalizes over every axis but 1; batch statistics while training (updating the running ones), else running."""

    def __init__(
        self, sz: int, eps: float = 1e-5, affine: bool = True, track_running_stats: bool = True, momentum: float = 0.1
    ):
        self.eps, self.track_running_stats, self.momentum = eps, track_running_stats, momentum
        self.weight: Tensor | None = Tensor.ones(sz).contiguous() if affine else None
        self.bias: Tensor | None = Tensor.zeros(sz).contiguous() if affine else None
        self.num_batches_tracked = Tensor.zeros((), dtype=dtypes.int64).contiguous().is_param_(False)
        if track_running_stats:
            self.running_mean = Tensor.zeros(sz).contiguous().is_param_(False)
            self.running_var = Tensor.ones(sz).contiguous().is_param_(False)

    def __call__(self, x: Tensor) -> Tensor:
        if x.ndim < 2:
            raise ValueError(f"BatchNorm needs input with a channel axis (N, C, ...), got shape {x.shape}")
        axes = tuple(i for i in range(x.ndim) if i != 1)
        shape = (1, -1) + (1,) * (x.ndim - 2)
        if _training() or not self.track_running_stats:
            mean = x.mean(axis=axes)
            var = ((x - mean.reshape(shape)) ** 2).mean(axis=axes)
            if _training() and self.track_running_stats:
                n = x.numel() // x.shape[1]
                unbiased = var.detach() * (n / max(n - 1, 1))
                self.running_mean.assign((1 - self.momentum) * self.running_mean + self.momentum * mean.detach())
                self.running_var.assign((1 - self.momentum) * self.running_var + self.momentum * unbiased)
                self.num_batches_tracked.assign(self.num_batches_tracked + 1)
        else:
            mean, var = self.running_mean, self.running_var
        out = (x - mean.reshape(shape)) * (var + self.eps).rsqrt().reshape(shape)
        if self.weight is not None:
            out = out * self.weight.reshape(shape)
        return out + self.bias.reshape(shape) if self.bias is not None else out


BatchNorm1d = BatchNorm2d = BatchNorm3d = BatchNorm


class LayerNorm:
    def __init__(self, normalized_shape: int | Sequence[int], eps: float = 1e-5, elementwise_affine: bool = True):
        self.normalized_shape = _tuple(normalized_shape, 1)
        self.eps = eps
        self.weight = Tensor.ones(*self.normalized_shape).contiguous() if elementwise_affine else None
        self.bias = Tensor.zeros(*self.normalized_shape).contiguous() if elementwise_affine else None

    def __call__(self, x: Tensor) -> Tensor:
        n = len(self.normalized_shape)
        assert x.shape[-n:] == self.normalized_shape, f"last dims of input {x.shape} must be {self.normalized_shape}"
        out = _normalize(x, tuple(range(x.ndim - n, x.ndim)), self.eps)
        return out * self.weight + self.bias if self.weight is not None else out


class LayerNorm2d(LayerNorm):
    """LayerNorm over the channel axis of (N, C, H, W)."""

    def __call__(self, x: Tensor) -> Tensor:
        return super().__call__(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class GroupNorm:
    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True):
        if num_channels % num_groups:
            raise ValueError(f"num_channels {num_channels} must be divisible by num_groups {num_groups}")
        self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
        self.weight = Tensor.ones(num_channels).contiguous() if affine else None
        self.bias = Tensor.zeros(num_channels).contiguous() if affine else None

    def __call__(self, x: Tensor) -> Tensor:
        grouped = x.reshape(x.shape[0], self.num_groups, -1)
        return _channel_affine(_normalize(grouped, (2,), self.eps).reshape(x.shape), self.weight, self.bias)


class InstanceNorm:
    def __init__(self, num_features: int, eps: float = 1e-5, affine: bool = True):
        self.num_features, self.eps = num_features, eps
        self.weight = Tensor.ones(num_features).contiguous() if affine else None
        self.bias = Tensor.zeros(num_features).contiguous() if affine else None

    def __call__(self, x: Tensor) -> Tensor:
        return _channel_affine(_normalize(x, tuple(range(2, x.ndim)), self.eps), self.weight, self.bias)


class RMSNorm:
    def __init__(self, dim: int, eps: float = 1e-6, elementwise_affine: bool = True):
        self.eps = eps
        self.weight = Tensor.ones(dim).contiguous() if elementwise_affine else None

    def __call__(self, x: Tensor) -> Tensor:
        xf = x.float()
        out = (xf * ((xf * xf).mean(axis=-1, keepdim=True) + self.eps).rsqrt()).cast(x.dtype)
        return out * self.weight if self.weight is not None else out


class Embedding:
    def __init__(self, vocab_size: int, embed_size: int):
        self.vocab_size, self.embed_size = vocab_size, embed_size
        self.weight = Tensor.glorot_uniform(vocab_size, embed_size)

    def __call__(self, idx: Tensor) -> Tensor:
        if not dtypes.is_int(idx.dtype):
            raise TypeError(f"Embedding needs integer indices, got {idx.dtype}")
        # rows loaded through the indices; the gradient adds into the rows picked, repeated ones accumulating
        out = gather_rows(self.weight, idx)
        check_index_bounds("Embedding", "vocab_size", idx, 0, self.vocab_size, out)
        return out


class LSTMCell:
    def __init__(self, input_size: int, hidden_size: int, bias: bool = True):
        bound = 1 / math.sqrt(hidden_size)
        self.hidden_size = hidden_size
        self.weight_ih = Tensor.uniform(hidden_size * 4, input_size, low=-bound, high=bound)
        self.weight_hh = Tensor.uniform(hidden_size * 4, hidden_size, low=-bound, high=bound)
        self.bias_ih = Tensor.zeros(hidden_size * 4).contiguous() if bias else None
        self.bias_hh = Tensor.zeros(hidden_size * 4).contiguous() if bias else None

    def __call__(self, x: Tensor, hc: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        if hc is None:
            zeros = Tensor.zeros(*x.shape[:-1], self.hidden_size, dtype=x.dtype, device=x.device)
            hc = (zeros, zeros)
        h, c = hc
        gates = x @ self.weight_ih.T + h @ self.weight_hh.T
        if self.bias_ih is not None:
            gates = gates + self.bias_ih + self.bias_hh
        H = self.hidden_size
        i, f, g, o = (
            gates[..., :H].sigmoid(),
            gates[..., H : 2 * H].sigmoid(),
            gates[..., 2 * H : 3 * H].tanh(),
            gates[..., 3 * H :].sigmoid(),
        )
        new_c = f * c + i * g
        return o * new_c.tanh(), new_c
