"""Tensor methods by group (docs/api.md), each group a mixin of Tensor (tensor.py). A mixin builds tensors of its own
class (`type(self)(...)`, `cls.arange(...)`, a helper's tensor argument) and tests for tensors with `TensorBase`
(base.py), so no module here imports tensor.py."""
