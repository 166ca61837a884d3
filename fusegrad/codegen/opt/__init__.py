"""Optimizations as explicit actions on a kernel's ranges: an `Opt` names one, `check_opts` validates a list against
a kernel's output shape, and the lowerer applies them. `hand_coded_opts` (heuristic.py) chooses them."""

from __future__ import annotations
import enum
from dataclasses import dataclass


class OptOps(enum.Enum):
    # compute `amount` consecutive outputs along an output axis per loop iteration, each a separately named value
    UPCAST = "UPCAST"
    # cache blocking: walk an axis's tiles (its upcast groups, or elements) in blocks of `amount`, the loop over the
    # tiles of one block moved innermost among the output loops, so what the other axes read is reused by the block
    TILE = "TILE"


@dataclass(frozen=True)
class Opt:
    op: OptOps
    axis: int  # an axis of the kernel's output shape
    amount: int

    def __repr__(self) -> str:
        return f"Opt({self.op.value}, axis={self.axis}, amount={self.amount})"


class OptError(ValueError):
    """An opt that cannot apply to this kernel; the message names the opt and the shape."""


@dataclass(frozen=True)
class AppliedOpts:
    upcasts: dict[int, int]  # output axis -> outputs per tile
    tiles: dict[int, int]  # output axis -> tiles per block


def check_opts(opts: tuple[Opt, ...] | list[Opt], shape: tuple[int, ...], reads_output: bool) -> AppliedOpts:
    """What valid opts do to each axis, else OptError. An axis whose size the amount does not divide gets a last tile
    (or block) that overlaps the one before it (recomputing equal values), which is wrong when the kernel reads the
    buffer it writes, so such a kernel needs amounts that divide."""
    upcasts: dict[int, int] = {}
    tiles: dict[int, int] = {}
    for opt in opts:
        if not isinstance(opt, Opt) or not isinstance(opt.op, OptOps):
            raise OptError(f"not an Opt: {opt!r}")
        if not isinstance(opt.axis, int) or not 0 <= opt.axis < len(shape):
            raise OptError(f"{opt}: axis {opt.axis!r} is not an axis of the output shape {shape}")
        if opt.op is OptOps.UPCAST:
            size = shape[opt.axis]
            if not isinstance(opt.amount, int) or opt.amount < 2:
                raise OptError(f"{opt}: amount must be an int >= 2, got {opt.amount!r}")
            if opt.axis in upcasts:
                raise OptError(f"{opt}: axis {opt.axis} of shape {shape} is already upcast by {upcasts[opt.axis]}")
            if opt.amount > size:
                raise OptError(f"{opt}: amount {opt.amount} exceeds the size {size} of axis {opt.axis} of {shape}")
            if reads_output and size % opt.amount:
                raise OptError(
                    f"{opt}: amount {opt.amount} does not divide the size {size} of axis {opt.axis} of {shape}, and "
                    "the kernel reads the buffer it writes, so an overlapping last tile would read its own results"
                )
            upcasts[opt.axis] = opt.amount
        elif opt.op is OptOps.TILE:
            if not isinstance(opt.amount, int) or opt.amount < 2:
                raise OptError(f"{opt}: amount must be an int >= 2, got {opt.amount!r}")
            if opt.axis in tiles:
                raise OptError(f"{opt}: axis {opt.axis} of shape {shape} is already tiled by {tiles[opt.axis]}")
            tiles[opt.axis] = opt.amount
    for axis, amount in tiles.items():
        count = -(-shape[axis] // upcasts.get(axis, 1))
        if amount > count:
            raise OptError(f"Opt(TILE, axis={axis}, amount={amount}): amount exceeds the {count} tiles of axis {axis}")
        if reads_output and count % amount:
            raise OptError(
                f"Opt(TILE, axis={axis}, amount={amount}): amount does not divide the {count} tiles of axis {axis}, "
                "and the kernel reads the buffer it writes, so an overlapping last block would read its own results"
            )
    if _lanes(upcasts) > MAX_LANES:
        raise OptError(f"{list(opts)}: {_lanes(upcasts)} outputs per iteration exceed the limit of {MAX_LANES}")
    return AppliedOpts(upcasts, tiles)


# past this many separately named outputs per iteration a kernel only grows, it cannot keep them in registers
MAX_LANES = 1024


def _lanes(upcasts: dict[int, int]) -> int:
    out = 1
    for amount in upcasts.values():
        out *= amount
    return out
