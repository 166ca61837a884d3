"""Tensor methods by group (docs/api.md) as mixins of Tensor; each module gets Tensor bound once it is defined."""

from types import ModuleType

from fusegrad.tensor_ops import (
    conv,
    creation,
    elementwise,
    indexing,
    linalg,
    losses,
    movement,
    nn,
    pool,
    reduce,
    sorting,
    unary,
)

MODULES: tuple[ModuleType, ...] = (
    creation,
    unary,
    elementwise,
    reduce,
    movement,
    indexing,
    linalg,
    conv,
    pool,
    nn,
    losses,
    sorting,
)


def bind_tensor_class(cls: type) -> None:
    """Mixin code refers to `Tensor` by name (constructors, isinstance); bind it once the class exists."""
    for module in MODULES:
        module.Tensor = cls  # type: ignore[attr-defined]
