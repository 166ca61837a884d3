"""Sorting, selection and miscellaneous (docs/api.md).

Sorting compares order rows (an order-preserving integer key of each value plus its position), so the order is
total and the sort stable. Long rows go through a bitonic network over the row padded to a power of two:
log2(n)*(log2(n)+1)/2 compare-exchange steps built from movement ops and `where`, a few steps per kernel. Short rows
are ranked instead (all pairs compared in one reduce). Float values ride along, so their gradient flows back through
the same exchanges (each network kernel materializes its gradient, see contiguous_backward).

keccak is the SHA-3 sponge with Keccak-f[1600] as lane arithmetic on uint64 tensors, one kernel per round."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from fusegrad.dtype import DType, dtypes
from fusegrad.uop.ops import Ops

if TYPE_CHECKING:
    from fusegrad.tensor import Tensor

Scalar = int | float | bool

# compare-exchange steps fused into one kernel: a kernel reads 2**STEPS_PER_KERNEL rows per output, and each kernel
# costs a compile, so a few steps per kernel is the balance
STEPS_PER_KERNEL = 3
# rows up to this length are sorted by ranking all pairs: for short rows that is less work and far fewer kernels
RANK_SORT_MAX = 64


def _order_key(v: Tensor, descending: bool) -> Tensor:
    """Unsigned integers whose order is the sort order of v: -0 equals +0, NaN is the largest value (like torch)."""
    dt = v.dtype
    wide = dt.itemsize == 8
    key_dt = dtypes.uint64 if wide else dtypes.uint32
    sign = 1 << (key_dt.bitsize - 1)
    if dtypes.is_float(dt):
        f = v.cast(dtypes.float64 if wide else dtypes.float32)
        bits = f.eq(0).where(0, f).bitcast(key_dt)
        bits = f.ne(f).where(0x7FF8000000000000 if wide else 0x7FC00000, bits)  # one NaN pattern, above +inf
        # IEEE floats order like sign-magnitude integers: flip negatives entirely, set the sign bit of positives
        key = (bits >= sign).where(~bits, bits | sign)
    elif dtypes.is_unsigned(dt) or dt is dtypes.bool:
        key = v.cast(key_dt)
    else:
        key = v.cast(dtypes.int64 if wide else dtypes.int32).bitcast(key_dt) ^ sign
    return ~key if descending else key


def _last_value(dt: DType, descending: bool) -> Scalar:
    """A value that sorts after every other one (ties go to the smaller index, so padding stays behind real data)."""
    if dtypes.is_float(dt):
        return -float("inf") if descending else float("nan")
    return dt.min if descending else dt.max


def _decode_key(key: Tensor, dt: DType, descending: bool) -> Tensor:
    """The integer or bool value of an order key (the inverse of _order_key for non-float dtypes)."""
    key = ~key if descending else key
    if dtypes.is_unsigned(dt) or dt is dtypes.bool:
        return key.cast(dt)
    signed = dtypes.int64 if key.dtype.itemsize == 8 else dtypes.int32
    return (key ^ (1 << (key.dtype.bitsize - 1))).bitcast(signed).cast(dt)


def _precedes(a: list[Tensor], b: list[Tensor]) -> Tensor:
    """a < b, comparing the lists of order tensors lexicographically."""
    less = a[-1] < b[-1]
    for x, y in zip(reversed(a[:-1]), reversed(b[:-1])):
        less = (x < y) | (x.eq(y) & less)
    return less


OrderOf = Callable[[list["Tensor"]], list["Tensor"]]


def _sort_state(x: Tensor, descending: bool) -> tuple[list[Tensor], OrderOf]:
    """The tensors a sort moves around, and how to read their order (tensors compared lexicographically): the key
    and the position, so the order is total and ties keep their original order."""
    n = x.shape[-1]
    position = type(x).arange(n, device=x.device).reshape((1,) * (x.ndim - 1) + (n,)).expand(x.shape)
    # no room to pack a 64-bit key with its position: move the values and positions, and key the values on the fly
    if x.dtype.itemsize == 8:
        return [x, position], lambda state: [_order_key(state[0], descending), state[1]]
    packed = (_order_key(x, descending).cast(dtypes.uint64) << 32) | position.cast(dtypes.uint64)
    # floats also move their values, so the gradient can follow them back
    return [packed, x] if dtypes.is_float(x.dtype) else [packed], lambda state: [state[0]]


def _sorted_result(state: list[Tensor], dt: DType, descending: bool) -> tuple[Tensor, Tensor]:
    """(values, int32 positions) from a sorted state."""
    if dt.itemsize == 8:
        return state[0], state[1]
    index = (state[0] & 0xFFFFFFFF).cast(dtypes.int32)
    return state[1] if len(state) > 1 else _decode_key((state[0] >> 32).cast(dtypes.uint32), dt, descending), index


def _rank_sort(x: Tensor, descending: bool) -> tuple[Tensor, Tensor]:
    """Stable sort of short rows: an element's rank is how many elements precede it, then each rank picks its element
    (one reduce each over all pairs: O(n^2) work, but three kernels instead of a network's dozens)."""
    n = x.shape[-1]
    state, order_of = _sort_state(x, descending)
    order = order_of(state)
    rank = _precedes([o.unsqueeze(-2) for o in order], [o.unsqueeze(-1) for o in order]).cast(dtypes.int32).sum(-1)
    rank_is = rank.unsqueeze(-2).eq(
        type(x).arange(n, device=x.device).reshape(n, 1)
    )  # [..., r, i]: element i has rank r

    def pick(t: Tensor) -> Tensor:  # a sum over one selected element (bool adds as or)
        return rank_is.where(t.unsqueeze(-2), False if t.dtype is dtypes.bool else 0)._reduce(Ops.ADD, -1, False)

    return _sorted_result([pick(t) for t in state], x.dtype, descending)


def _bitonic_steps(n: int) -> Iterator[tuple[int, bool]]:
    """(block, mirrored) per compare-exchange step of a bitonic sort of n = 2**k elements: each merge first compares
    mirrored positions of its block (so every comparator sorts ascending), then halves of ever smaller blocks."""
    merge = 2
    while merge <= n:
        yield merge, True
        block = merge // 2
        while block >= 2:
            yield block, False
            block //= 2
        merge *= 2


def _compare_exchange(state: list[Tensor], order_of: OrderOf, block: int, mirrored: bool) -> list[Tensor]:
    """One network step along the last axis: in every block the lower half keeps the first, the upper half the later
    of each pair (element, partner), where the partner is the mirrored or the same position in the other half."""
    shape = state[0].shape
    view = shape[:-1] + (shape[-1] // block, 2, block // 2)
    own = [t.reshape(view) for t in state]
    partner = [t.flip((-2, -1) if mirrored else (-2,)) for t in own]
    lower = type(own[0]).arange(2, device=own[0].device).reshape(2, 1).eq(0)
    take = lower.eq(_precedes(order_of(partner), order_of(own)))
    return [take.where(p, o).reshape(shape) for p, o in zip(partner, own)]


def _bitonic_sort(x: Tensor, descending: bool) -> tuple[Tensor, Tensor]:
    """Stable sort along the last axis, whose length is a power of two, by the bitonic network."""
    state, order_of = _sort_state(x, descending)
    steps = list(_bitonic_steps(x.shape[-1]))
    for first in range(0, len(steps), STEPS_PER_KERNEL):
        for block, mirrored in steps[first : first + STEPS_PER_KERNEL]:
            state = _compare_exchange(state, order_of, block, mirrored)
        state = [t.contiguous().contiguous_backward() if dtypes.is_float(t.dtype) else t.contiguous() for t in state]
    return _sorted_result(state, x.dtype, descending)


def _sort_last(x: Tensor, descending: bool) -> tuple[Tensor, Tensor]:
    n = x.shape[-1]
    if n <= RANK_SORT_MAX:
        return _rank_sort(x, descending)
    size = 1 << (n - 1).bit_length()
    # the padding sorts last: its key is the largest, and it loses ties by position
    padded = (
        x.pad(((0, 0),) * (x.ndim - 1) + ((0, size - n),), value=_last_value(x.dtype, descending)) if size > n else x
    )
    values, index = _bitonic_sort(padded, descending)
    keep = tuple((0, d) for d in x.shape)
    return values.shrink(keep), index.shrink(keep)


# ---------------------------------------------------------------------------------------------------------------------
# Keccak (FIPS 202): the permutation's constants, derived as the standard defines them


def _round_constants() -> list[int]:
    """The 24 iota constants from the degree-8 LFSR (FIPS 202, algorithm 5)."""
    state, bits = 1, []
    for _ in range(7 * 24):
        bits.append(state & 1)
        state = ((state << 1) ^ (0x71 if state & 0x80 else 0)) & 0xFF
    return [sum(bits[7 * r + j] << (2**j - 1) for j in range(7)) for r in range(24)]


def _rotation_offsets() -> list[int]:
    """rho's rotation of lane x + 5y, walking (x, y) -> (y, 2x + 3y) from (1, 0)."""
    offsets, x, y = [0] * 25, 1, 0
    for t in range(24):
        offsets[x + 5 * y] = (t + 1) * (t + 2) // 2 % 64
        x, y = y, (2 * x + 3 * y) % 5
    return offsets


KECCAK_ROUND_CONSTANTS, KECCAK_ROTATIONS = _round_constants(), _rotation_offsets()
# pi moves lane (x, y) to (y, 2x + 3y): output lane X + 5Y reads input lane (X + 3Y) % 5 + 5X
KECCAK_PI_SOURCE = [(x + 3 * y) % 5 + 5 * x for y in range(5) for x in range(5)]
KECCAK_CONFIGS = {"sha3_224": (144, 0x06), "sha3_256": (136, 0x06), "shake_128": (168, 0x1F)}
HASH_CHUNK = 168 * 8  # hash() digests chunks of this many bytes side by side, then the digests


def _rotl(lanes: Tensor, amount: Tensor | int) -> Tensor:
    return (lanes << amount) | (lanes >> ((64 - amount) & 63))


def _keccak_round(a: Tensor, pis: list[Tensor], rotations: Tensor, iota: Tensor) -> Tensor:
    """One round of Keccak-f[1600] on lanes (..., 25), lane x + 5y; pis[k] picks lane (x + k, y) after pi."""
    lead = a.shape[:-1]
    rows = a.reshape(lead + (5, 5))  # [y][x]
    planes = [rows.shrink(tuple((0, d) for d in lead) + ((y, y + 1), (0, 5))).reshape(lead + (5,)) for y in range(5)]
    parity = planes[0] ^ planes[1] ^ planes[2] ^ planes[3] ^ planes[4]
    theta = rows ^ (parity.roll(1, -1) ^ _rotl(parity.roll(-1, -1), 1)).unsqueeze(-2)
    rotated = _rotl(theta.reshape(a.shape), rotations).unsqueeze(-2)
    # each pick is a one-hot reduce (one source lane per output lane); three of them keep chi in the same kernel
    picked = [pi.where(rotated, 0).sum(-1) for pi in pis]
    return picked[0] ^ (~picked[1] & picked[2]) ^ iota


def _keccak(data: Tensor, rate: int, dsbyte: int) -> Tensor:
    """Sponge over the last axis of uint8 data: pad10*1 after the domain byte, absorb rate bytes per block, squeeze
    (200 - rate) // 2 bytes."""
    if not 0 < rate < 200 or rate % 8:
        raise ValueError(f"keccak rate must be a multiple of 8 in (0, 200), got {rate}")
    n, lead, dev, tensor_class = data.shape[-1], data.shape[:-1], data.device, type(data)
    size = (n // rate + 1) * rate
    pos = tensor_class.arange(size, device=dev)
    padding = pos.eq(n).where(dsbyte, 0).cast(dtypes.uint8) | pos.eq(size - 1).where(0x80, 0).cast(dtypes.uint8)
    blocks = (data.pad(((0, 0),) * len(lead) + ((0, size - n),)) | padding).bitcast(dtypes.uint64)
    blocks = blocks.reshape(lead + (size // rate, rate // 8)).pad(((0, 0),) * (len(lead) + 1) + ((0, 25 - rate // 8),))
    blocks = blocks.contiguous()  # the byte packing once, not inside every round's kernel
    pis = [
        tensor_class([KECCAK_PI_SOURCE[(o + k) % 5 + o // 5 * 5] for o in range(25)], device=dev)
        .reshape(25, 1)
        .eq(tensor_class.arange(25, device=dev))
        for k in range(3)
    ]
    rotations = tensor_class(KECCAK_ROTATIONS, dtype=dtypes.uint64, device=dev)
    iotas = [tensor_class([rc] + [0] * 24, dtype=dtypes.uint64, device=dev) for rc in KECCAK_ROUND_CONSTANTS]
    state = tensor_class.zeros(lead + (25,), dtype=dtypes.uint64, device=dev)
    for b in range(size // rate):
        block = blocks.shrink(tuple((0, d) for d in lead) + ((b, b + 1), (0, 25))).reshape(lead + (25,))
        state = (state ^ block).contiguous()
        # every round is its own kernel, the same one each time (its constant comes from a buffer): one compile
        for iota in iotas:
            state = _keccak_round(state, pis, rotations, iota).contiguous()
    return state.bitcast(dtypes.uint8).shrink(tuple((0, d) for d in lead) + ((0, (200 - rate) // 2),))


class SortingMixin:
    def sort(self, dim: int = -1, descending: bool = False) -> tuple[Tensor, Tensor]:
        ax = self._axis(dim)
        if self.ndim == 0:
            return self, type(self).zeros((), dtype=dtypes.int32, device=self.device)
        last = self.ndim - 1
        x = self.transpose(ax, last)
        n = x.shape[-1]
        if n <= 1 or not x.numel():
            return self, type(self).zeros(self.shape, dtype=dtypes.int32, device=self.device)
        values, index = _sort_last(x, descending)
        return values.transpose(ax, last), index.transpose(ax, last)

    def argsort(self, dim: int = -1, descending: bool = False) -> Tensor:
        return self.sort(dim, descending)[1]

    def topk(self, k: int, dim: int = -1, largest: bool = True, sorted_: bool = True) -> tuple[Tensor, Tensor]:
        if not sorted_:
            raise NotImplementedError("topk(sorted_=False) is not supported; results always come sorted")
        ax = self._axis(dim)
        size = self.shape[ax] if self.ndim else 1
        if not 0 <= k <= size:
            raise ValueError(f"topk: k={k} is out of range for dimension {dim} of size {size}")
        values, index = self.sort(ax, descending=largest)
        if not self.ndim:
            return values, index
        keep = tuple((0, k) if i == ax else (0, d) for i, d in enumerate(self.shape))
        return values.shrink(keep), index.shrink(keep)

    def multinomial(self, num_samples: int = 1, replacement: bool = False) -> Tensor:
        if self.ndim not in (1, 2):
            raise RuntimeError(f"multinomial needs 1-D or 2-D weights, got shape {self.shape}")
        if num_samples < 1:
            raise RuntimeError(f"multinomial needs num_samples >= 1, got {num_samples}")
        categories = self.shape[-1]
        if not replacement and num_samples > categories:
            raise RuntimeError(f"cannot draw {num_samples} samples without replacement from {categories} categories")
        weights = self._float().reshape(-1, categories)
        rows = weights.shape[0]
        if replacement:
            # inverse CDF: the sample is the number of cumulative weights at or below a uniform draw
            cdf = weights.cumsum(1)
            cdf = cdf / cdf[:, -1:]
            draws = type(self).rand(rows, num_samples, 1, device=self.device)
            picked = (cdf.unsqueeze(1) <= draws).sum(2).minimum(categories - 1)
        else:
            # exponential race: the categories reaching E/w first (E ~ Exp(1)) are a weighted draw without replacement
            arrival = -(1 - type(self).rand(rows, categories, device=self.device)).log() / weights
            picked = arrival.argsort(1)[:, :num_samples]
        return picked.cast(dtypes.int32).reshape(self.shape[:-1] + (num_samples,))

    def keccak(self, cfg: str | tuple[int, int] = "sha3_256") -> Tensor:
        if isinstance(cfg, str) and cfg not in KECCAK_CONFIGS:
            raise ValueError(f"unknown keccak cfg {cfg!r}; known: {sorted(KECCAK_CONFIGS)}")
        rate, dsbyte = KECCAK_CONFIGS[cfg] if isinstance(cfg, str) else cfg
        if not self.ndim:
            raise ValueError("keccak needs byte data with at least one dim (it digests the last)")
        return _keccak(self if self.dtype is dtypes.uint8 else self.bitcast(dtypes.uint8), rate, dsbyte)

    def hash(self) -> Tensor:
        """shake_128 over the bytes; longer data digests HASH_CHUNK-byte chunks side by side, then (digests, length)."""
        data = self.reshape(-1) if self.ndim != 1 else self
        data = data if data.dtype is dtypes.uint8 else data.bitcast(dtypes.uint8)
        while data.shape[0] > HASH_CHUNK:
            n = data.shape[0]
            chunks = data.pad(((0, -n % HASH_CHUNK),)).reshape(-1, HASH_CHUNK)
            length = type(self)(list(n.to_bytes(8, "little")), dtype=dtypes.uint8, device=self.device)
            data = chunks.keccak("shake_128").reshape(-1).cat(length)
        return data.keccak("shake_128")

    # ---- raw building blocks [adv]
    def threefry(self, seed: int) -> Tensor:
        """uint32 random bits: Threefry-2x32 of this uint32 counter tensor under the key `seed`."""
        from fusegrad.tensor_ops.creation import threefry2x32

        return threefry2x32(self.cast(dtypes.uint32), 0, seed)

    @classmethod
    def random_bits(cls, key: int, counter: int, num: int) -> Tensor:
        """`num` uint32 random bits for a key, starting at a counter: the primitive under rand/randint."""
        return (cls.arange(num, dtype=dtypes.uint32) + (counter & 0xFFFFFFFF)).threefry(key)

    def alu(self, op: Ops, *src: Tensor) -> Tensor:
        """One raw elementwise op on broadcast, promoted operands."""
        if op is Ops.WHERE:
            return self.where(*src)
        if len(src) == 0:
            return self._alu(op)
        a, b = self._operand(src[0])
        return a._alu(op, b, dtype=dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ) else None)

    @staticmethod
    def usum(*xs: Tensor) -> Tensor:
        """The elementwise sum of several tensors."""
        out = xs[0]
        for x in xs[1:]:
            out = out + x
        return out

    @staticmethod
    def uprod(*xs: Tensor) -> Tensor:
        """The elementwise product of several tensors."""
        out = xs[0]
        for x in xs[1:]:
            out = out * x
        return out

    def image_dot(self, w: Tensor, dtype=None) -> Tensor:
        """IMAGE=1 variant of dot; without image textures it is dot."""
        return self.dot(w, dtype=dtype)

    def image_conv2d(
        self, weight: Tensor, bias: Tensor | None = None, groups: int = 1, stride=1, dilation=1, padding=0, dtype=None
    ) -> Tensor:
        """IMAGE=1 variant of conv2d; without image textures it is conv2d."""
        return self.conv2d(weight, bias, groups=groups, stride=stride, dilation=dilation, padding=padding, dtype=dtype)

    def custom_kernel(self, *lst: Tensor, fxn=None, grad_fxn=None) -> list[Tensor]:
        """Run fxn's kernel (docs/custom_kernels.md) over self and lst; returns the inputs it writes, updated."""
        from fusegrad.tensor_ops.custom_kernel import custom_kernel

        return custom_kernel((self, *lst), fxn, grad_fxn)

    def call(self, *lst: Tensor, fxn=None, grad_fxn=None) -> list[Tensor]:
        raise NotImplementedError("call (graph functions) is not supported yet")

    def callify(self, *lst: Tensor) -> list[Tensor]:
        raise NotImplementedError("callify (graph functions) is not supported yet")

    def as_param(self, slot: int) -> Tensor:
        raise NotImplementedError("as_param (graph function parameters) is not supported yet")

    def decode_hevc_frame(self, *args, **kwargs) -> Tensor:
        raise NotImplementedError("HEVC video decoding is not supported")
