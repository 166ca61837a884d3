"""The root class of Tensor, for the mixins' "is this a Tensor" checks without importing tensor.py."""


class TensorBase:
    """Tensor derives from it first: `isinstance(x, TensorBase)` is `isinstance(x, Tensor)` inside tensor_ops, where
    importing the class would make tensor.py and its mixins import each other."""

    __slots__ = ()
