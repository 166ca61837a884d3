"""Losses (docs/api.md): binary and categorical cross-entropy, nll_loss, and their argument checks."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fusegrad.dtype import dtypes
from fusegrad.helpers import CHECK_OOB
from fusegrad.tensor_ops.indexing import check_index_bounds

if TYPE_CHECKING:
    from fusegrad.tensor import Tensor


class _BatchSizeError(RuntimeError, ValueError):
    """torch raises ValueError for a batch-size mismatch of a loss, this API RuntimeError for any shape mismatch."""


def _check_batch(logits: Tensor, target: Tensor) -> None:
    if logits.ndim >= 2 and (target.ndim == 0 or target.shape[0] != logits.shape[0]):
        raise _BatchSizeError(
            f"Expected input batch_size ({logits.shape[0]}) to match target batch_size "
            f"({target.shape[0] if target.ndim else 0})."
        )


def _check_reduction(reduction: str) -> None:
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"{reduction!r} is not a valid value for reduction")


def _check_smoothing(label_smoothing: float) -> None:
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")


def _reduce_loss(loss: Tensor, reduction: str, count: Tensor | int | None = None) -> Tensor:
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / (loss.numel() if count is None else count)


def _classes_last(x: Tensor, class_axis: int) -> Tensor:
    return x.permute([i for i in range(x.ndim) if i != class_axis] + [class_axis])


class LossMixin:
    def binary_crossentropy(self, Y: Tensor, reduction: str = "mean") -> Tensor:
        _check_reduction(reduction)
        if self.shape != Y.shape:
            raise ValueError(f"binary_crossentropy target shape {Y.shape} != input shape {self.shape}")
        # torch clamps each log at -100 so that p in {0, 1} gives a finite loss
        loss = -(Y * self.log().maximum(-100.0) + (1 - Y) * (1 - self).log().maximum(-100.0))
        return _reduce_loss(loss, reduction)

    def binary_crossentropy_logits(
        self, Y: Tensor, reduction: str = "mean", pos_weight: Tensor | None = None
    ) -> Tensor:
        _check_reduction(reduction)
        if self.shape != Y.shape:
            raise ValueError(f"binary_crossentropy_logits target shape {Y.shape} != input shape {self.shape}")
        # log(1 + e^-x) written so that it never overflows: max(-x, 0) + log(1 + e^-|x|)
        softplus_neg = (-self).maximum(0) + (1 + (-self.abs()).exp()).log()
        pos = softplus_neg if pos_weight is None else (1 + (pos_weight - 1) * Y) * softplus_neg
        return _reduce_loss((1 - Y) * self + pos, reduction)

    def sparse_categorical_crossentropy(
        self,
        Y: Tensor,
        ignore_index: int = -1,
        label_smoothing: float = 0.0,
        reduction: str = "mean",
        _check_as: str = "sparse_categorical_crossentropy",
    ) -> Tensor:
        """Cross-entropy of logits with the classes on the LAST axis and class labels Y (integer-valued)."""
        _check_reduction(reduction)
        _check_smoothing(label_smoothing)
        if self.ndim == 0 or Y.shape != self.shape[:-1]:
            raise RuntimeError(
                f"sparse_categorical_crossentropy labels of shape {Y.shape} must have the shape of the logits "
                f"{self.shape} without its last (class) axis"
            )
        classes, logp = self.shape[-1], self.log_softmax(-1)
        picked = (Y.unsqueeze(-1) == type(self).arange(classes, device=self.device)).where(logp, 0).sum(-1)
        if CHECK_OOB:  # a label outside the classes (other than the ignored one) is an IndexError at realize
            check_index_bounds(_check_as, "classes", (Y == ignore_index).where(0, Y), 0, classes, picked)
        # without smoothing no term of the whole row: 0 * sum(logp) is NaN when a class's logit is -inf (masked)
        loss = -picked
        if label_smoothing:
            loss = -(1 - label_smoothing) * picked - label_smoothing / classes * logp.sum(-1)
        if ignore_index == -1:
            return _reduce_loss(loss, reduction)
        keep = Y != ignore_index
        return _reduce_loss(keep.where(loss, 0), reduction, keep.sum())

    def cross_entropy(self, Y: Tensor, reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
        """torch-like: classes on axis 1 (axis 0 for 1-D logits); Y holds class indices or class probabilities."""
        _check_reduction(reduction)
        _check_smoothing(label_smoothing)
        if self.ndim == 0:
            raise RuntimeError("cross_entropy needs logits with a class axis, got a 0-d tensor")
        class_axis = 1 if self.ndim >= 2 else 0
        logits = _classes_last(self, class_axis)
        if Y.shape == self.shape and dtypes.is_float(Y.dtype):
            target = _classes_last(Y, class_axis) * (1 - label_smoothing) + label_smoothing / self.shape[class_axis]
            return _reduce_loss(-(target * logits.log_softmax(-1)).sum(-1), reduction)
        without = self.shape[:class_axis] + self.shape[class_axis + 1 :]
        if Y.shape != self.shape:
            _check_batch(self, Y)
        if Y.shape != without or not dtypes.is_int(Y.dtype):
            raise RuntimeError(
                f"cross_entropy target ({Y.shape}, {Y.dtype}) must be integer class indices of shape "
                f"{without} or float probabilities of shape {self.shape}"
            )
        return logits.sparse_categorical_crossentropy(
            Y, label_smoothing=label_smoothing, reduction=reduction, _check_as="cross_entropy"
        )

    def nll_loss(
        self, Y: Tensor, weight: Tensor | None = None, ignore_index: int | None = None, reduction: str = "mean"
    ) -> Tensor:
        """Negative log-likelihood of log-probabilities (classes on axis 1, axis 0 for 1-D); a weighted mean divides by
        the summed weights of the counted targets."""
        _check_reduction(reduction)
        if self.ndim == 0:
            raise RuntimeError("nll_loss needs log-probabilities with a class axis, got a 0-d tensor")
        class_axis = 1 if self.ndim >= 2 else 0
        classes, without = self.shape[class_axis], self.shape[:class_axis] + self.shape[class_axis + 1 :]
        _check_batch(self, Y)
        if Y.shape != without:
            raise RuntimeError(f"nll_loss target shape {Y.shape} must be {without} for input {self.shape}")
        if not dtypes.is_int(Y.dtype):
            raise RuntimeError(f"nll_loss targets must be integer class indices, got {Y.dtype}")
        if weight is not None and weight.shape != (classes,):
            raise RuntimeError(f"nll_loss weight of shape {weight.shape} must have one entry per class ({classes})")
        hit = Y.unsqueeze(-1) == type(self).arange(classes, device=self.device)
        labels = Y if ignore_index is None else (Y == ignore_index).where(0, Y)
        check_index_bounds("nll_loss", "classes", labels, 0, classes, hit)
        w = hit.where(weight if weight is not None else 1.0, 0.0).cast(self.dtype).sum(-1)
        if ignore_index is not None:
            w = (Y != ignore_index).where(w, 0.0)
        loss = -hit.where(_classes_last(self, class_axis), 0).sum(-1) * w
        return _reduce_loss(loss, reduction, w.sum())
