"""GGML quantized tensors (llama.cpp's block formats) and the quantized matrix a matmul reads in place.

`GGMLQuantized` is a GGUF tensor as its blocks; `dequantize()` is the float32 tensor as a lazy graph over them.
`QuantizedMatrix` is a 2-D one rearranged once into planes a kernel walks contiguously: the quantized values of each
row in order (int8, or packed nibbles and bits) and, per 16 or 32 values, a scale (and an offset) that needs no
arithmetic to read (float16 as stored, or float32 where a K-quant multiplies two scales). A matvec over it is one
kernel whose inner loop runs over contiguous lanes of a group (up to MAX_PARTS parts unrolled in it, each with its
scale held in a register), summed over the groups outside it. A chunk of many rows (a prefill) multiplies by the
matrix dequantized once per call into panels of float32 columns (`matmul`), which a register tile of the matmul walks:
every row of the chunk shares that one pass over the quantized bytes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fusegrad.dtype import DType, dtypes
from fusegrad.helpers import QUANT_DOT
from fusegrad.nn.panels_avx2 import avx2_panels, panels_fit
from fusegrad.tensor import Tensor

# ggml type -> (name, elements per block, bytes per block); plain types have 1-element blocks
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    30: ("BF16", 1, 2),
}
GGML_PLAIN_TYPES: dict[int, DType] = {
    0: dtypes.float32,
    1: dtypes.float16,
    24: dtypes.int8,
    25: dtypes.int16,
    26: dtypes.int32,
    27: dtypes.int64,
    28: dtypes.float64,
    30: dtypes.bfloat16,
}


def _f16_at(blocks: Tensor, i: int) -> Tensor:
    """The little-endian float16 at byte i of each block, as a (blocks, 1) float32 column."""
    bits = blocks[:, i].cast(dtypes.uint16) | (blocks[:, i + 1].cast(dtypes.uint16) << 8)
    return bits.bitcast(dtypes.float16).cast(dtypes.float32).reshape(-1, 1)


def _split_bits(q: Tensor, width: int, count: int) -> Tensor:
    """(..., k) bytes -> (..., count, k) int32 fields: bits [width*j, width*(j+1)) of each byte, for j < count."""
    shifts = (Tensor.arange(count, device=q.device) * width).reshape(*(1,) * (q.ndim - 1), count, 1)
    return (q.unsqueeze(-2).expand(*q.shape[:-1], count, q.shape[-1]).cast(dtypes.int32) >> shifts) & ((1 << width) - 1)


def _cat_last(a: Tensor, b: Tensor) -> Tensor:
    """a and b side by side on the last axis (pads and an add fuse into the consumer)."""
    return a.pad(((0, 0),) * (a.ndim - 1) + ((0, b.shape[-1]),)) + b.pad(((0, 0),) * (b.ndim - 1) + ((a.shape[-1], 0),))


def _dequant_q4_0(b: Tensor) -> Tensor:
    return (_split_bits(b[:, 2:18], 4, 2) - 8).cast(dtypes.float32) * _f16_at(b, 0).unsqueeze(-1)


def _dequant_q4_1(b: Tensor) -> Tensor:
    return _split_bits(b[:, 4:20], 4, 2).cast(dtypes.float32) * _f16_at(b, 0).unsqueeze(-1) + _f16_at(b, 2).unsqueeze(
        -1
    )


def _dequant_q8_0(b: Tensor) -> Tensor:
    return b[:, 2:34].bitcast(dtypes.int8).cast(dtypes.float32) * _f16_at(b, 0)


def _dequant_q4_k(b: Tensor) -> Tensor:
    s = b[:, 4:16].cast(dtypes.int32)
    # 8 six-bit scales and mins: sub-blocks 0-3 in the low bits of bytes 0-7,
    # 4-7 split over bytes 8-11 and bytes' top bits
    scales = _cat_last(s[:, 0:4] & 63, (s[:, 8:12] & 0xF) | ((s[:, 0:4] >> 6) << 4)).cast(dtypes.float32)
    mins = _cat_last(s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)).cast(dtypes.float32)
    q = _split_bits(b[:, 16:144].reshape(-1, 4, 32), 4, 2).reshape(-1, 8, 32).cast(dtypes.float32)
    d, dmin = _f16_at(b, 0) * scales, _f16_at(b, 2) * mins
    return d.unsqueeze(-1) * q - dmin.unsqueeze(-1)


def _dequant_q6_k(b: Tensor) -> Tensor:
    # per half of 128 values: group k of 32 takes nibble k//2 of ql half k%2, plus 2 high bits k of qh
    low = _split_bits(b[:, 0:128].reshape(-1, 2, 2, 32), 4, 2).permute(0, 1, 3, 2, 4).reshape(-1, 2, 4, 32)
    high = _split_bits(b[:, 128:192].reshape(-1, 2, 32), 2, 4)
    q = ((low | (high << 4)) - 32).cast(dtypes.float32)
    scales = (
        b[:, 192:208]
        .bitcast(dtypes.int8)
        .cast(dtypes.float32)
        .reshape(-1, 2, 4, 2, 1)
        .expand(-1, 2, 4, 2, 16)
        .reshape(-1, 2, 4, 32)
    )
    return _f16_at(b, 208).reshape(-1, 1, 1, 1) * scales * q


DEQUANTIZERS: dict[int, Callable[[Tensor], Tensor]] = {
    2: _dequant_q4_0,
    3: _dequant_q4_1,
    8: _dequant_q8_0,
    12: _dequant_q4_k,
    14: _dequant_q6_k,
}


class GGMLQuantized:
    """A quantized GGUF tensor kept as its blocks: `blocks` is (n_blocks, bytes per block) uint8, lazily on DISK until
    moved; dequantize() is the float32 tensor of `shape` as a lazy graph over the blocks (it fuses into its user)."""

    def __init__(self, name: str, ggml_type: int, shape: tuple[int, ...], blocks: Tensor):
        if ggml_type not in DEQUANTIZERS:
            raise ValueError(f"{name}: ggml type {ggml_type} is not a supported quantized type; supported: {_names()}")
        self.name, self.ggml_type, self.shape, self.blocks = name, ggml_type, shape, blocks

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.ggml_type][0]

    def to(self, device: str) -> GGMLQuantized:
        return GGMLQuantized(self.name, self.ggml_type, self.shape, self.blocks.to(device).contiguous())

    def dequantize(self) -> Tensor:
        return DEQUANTIZERS[self.ggml_type](_on_compute_device(self.blocks)).reshape(self.shape)

    def __repr__(self) -> str:
        return f"<GGMLQuantized {self.name} {self.type_name} {self.shape} on {self.blocks.device}>"


def _names() -> list[str]:
    return sorted(GGML_TYPES[k][0] for k in DEQUANTIZERS)


def _on_compute_device(blocks: Tensor) -> Tensor:
    """Blocks a kernel can read: a DISK tensor is copied to the default device first."""
    from fusegrad.runtime.buffers import default_device

    return blocks.to(default_device()) if blocks.device.startswith("DISK:") else blocks


def _f16_plane(b: Tensor, i: int) -> Tensor:
    """The little-endian float16 at byte i of each block, as a (blocks,) float16 tensor (a kernel reads it as it is)."""
    return (b[:, i].cast(dtypes.uint16) | (b[:, i + 1].cast(dtypes.uint16) << 8)).bitcast(dtypes.float16)


@dataclass(frozen=True)
class QuantFormat:
    """How one ggml type becomes planes and how a kernel reads them back. Values come in groups of `parts` x `lanes`:
    the lanes of a part are contiguous (the kernel's inner loop runs over them) and each part has its own scale and
    offset (the parts of a group are unrolled in that loop: e.g. the low and high nibbles of the same bytes).
    `planes(blocks)` gives the planes (first dim: blocks in row order), `values(planes, rows, groups)` the
    (rows, *groups, parts, lanes) quantized values as float32 (the groups as one dim, or several that walk them
    without index division), `scales(planes, rows, groups)` the (rows, *groups, parts) scale and offset (None: no
    offset), and `x_order(x, groups)` x (n, cols) as (n, 1, *groups, parts, lanes) in the same order.
    Scales and offsets are broadcast over lanes, so they must be plain loads (no arithmetic): the
    scheduler would otherwise compute them into a buffer of their own."""

    parts: int
    lanes: int
    planes: Callable[[Tensor], tuple[Tensor, ...]]
    values: Callable[[tuple[Tensor, ...], int, int], Tensor]
    scales: Callable[[tuple[Tensor, ...], int, int], tuple[Tensor, Tensor | None]]
    x_order: Callable[[Tensor, int], Tensor] | None = None
    columns: Callable[[Tensor], Tensor] | None = None  # the values' dims back in column order (x_order's inverse)

    @property
    def group(self) -> int:
        return self.parts * self.lanes


def _nibbles(packed: Tensor, rows: int, groups: int, lanes: int) -> Tensor:
    """(rows, groups, 2, lanes) values 0..15 of bytes packed (rows, groups, lanes): low nibbles, then high ones,
    unpacked in 8 bits: constant shifts of bytes (_split_bits' per-part shifts of ints made Q4_K's prefill panels
    twice as slow, the compiler shifting each value by a variable count)."""
    p = packed.reshape(rows, groups, 1, lanes)
    return _cat_parts(p & 15, p >> 4).cast(dtypes.int32)


def _cat_parts(low: Tensor, high: Tensor) -> Tensor:
    """(..., 1, lanes) low and high as (..., 2, lanes) (pads and an add fuse into the consumer)."""
    z = ((0, 0),) * (low.ndim - 2)
    return low.pad(z + ((0, 1), (0, 0))) + high.pad(z + ((1, 0), (0, 0)))


def _q8_0_planes(b: Tensor) -> tuple[Tensor, ...]:
    return b[:, 2:34].bitcast(dtypes.int8).contiguous(), _f16_plane(b, 0).contiguous()


def _q4_0_planes(b: Tensor) -> tuple[Tensor, ...]:
    return b[:, 2:18].contiguous(), _f16_plane(b, 0).contiguous()


def _q4_1_planes(b: Tensor) -> tuple[Tensor, ...]:
    return b[:, 4:20].contiguous(), _f16_plane(b, 0).contiguous(), _f16_plane(b, 2).contiguous()


def _q4_k_planes(b: Tensor) -> tuple[Tensor, ...]:
    # per sub-block of 32: scale d*sc and offset -dmin*m, exact in float32 (11-bit times 6-bit)
    s = b[:, 4:16].cast(dtypes.int32)
    sc = _cat_last(s[:, 0:4] & 63, (s[:, 8:12] & 0xF) | ((s[:, 0:4] >> 6) << 4)).cast(dtypes.float32)
    mins = _cat_last(s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)).cast(dtypes.float32)
    scale, offset = _f16_at(b, 0) * sc, -(_f16_at(b, 2) * mins)
    return b[:, 16:144].contiguous(), scale.contiguous(), offset.contiguous()


def _q4_k_stored_scales(b: Tensor) -> tuple[Tensor, ...]:
    """Q4_K's scales as stored, for a matvec that folds them into integer sums (the AVX2 kernel): the 6-bit scale and
    min of each sub-block of 32 as bytes, and d and dmin of each block of 256 as float32."""
    s = b[:, 4:16].cast(dtypes.int32)
    sc = _cat_last(s[:, 0:4] & 63, (s[:, 8:12] & 0xF) | ((s[:, 0:4] >> 6) << 4)).cast(dtypes.uint8)
    mins = _cat_last(s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)).cast(dtypes.uint8)
    return sc.contiguous(), mins.contiguous(), _f16_at(b, 0).contiguous(), _f16_at(b, 2).contiguous()


def _q6_k_planes(b: Tensor) -> tuple[Tensor, ...]:
    # per 16 values: scale d*sc, exact in float32 (11-bit times 8-bit); stored in (half, k, l//16) order
    scale = _f16_at(b, 208) * b[:, 192:208].bitcast(dtypes.int8).cast(dtypes.float32)
    return b[:, 0:128].contiguous(), b[:, 128:192].contiguous(), scale.contiguous()


def _q6_k_values(p: tuple[Tensor, ...], rows: int, groups: int) -> Tensor:
    # per half of 128 values: value l + 32k (l < 32, k < 4) is nibble k//2 of ql byte l + 32*(k%2), plus bits 2k..2k+1
    # of qh byte l as its high bits; a group is one half's l//16 (16 lanes), its parts the 4 k
    halves = groups // 2
    low = _split_bits(p[0].reshape(rows, halves, 2, 32), 4, 2).permute(0, 1, 3, 2, 4).reshape(rows, halves, 4, 32)
    high = _split_bits(p[1].reshape(rows, halves, 32), 2, 4)
    q = ((low | (high << 4)) - 32).cast(dtypes.float32)
    return q.reshape(rows, halves, 4, 2, 16).permute(0, 1, 3, 2, 4)


def _q6_k_x(x: Tensor, groups: int) -> Tensor:
    return x.reshape(x.shape[0], 1, groups // 2, 4, 2, 16).permute(0, 1, 2, 4, 3, 5)


def _f32(t: Tensor, *shape: int) -> Tensor:
    return t.reshape(shape).cast(dtypes.float32)


QUANT_FORMATS: dict[int, QuantFormat] = {
    8: QuantFormat(
        1,
        32,
        _q8_0_planes,
        lambda p, r, g: p[0].reshape(r, g, 1, 32).cast(dtypes.float32),
        lambda p, r, g: (_f32(p[1], r, g, 1), None),
    ),
    # a block's byte j holds value j in its low nibble and value j + 16 in its high one
    2: QuantFormat(
        2,
        16,
        _q4_0_planes,
        lambda p, r, g: (_nibbles(p[0], r, g, 16) - 8).cast(dtypes.float32),
        lambda p, r, g: (_f32(p[1], r, g, 1).expand(r, g, 2), None),
    ),
    3: QuantFormat(
        2,
        16,
        _q4_1_planes,
        lambda p, r, g: _nibbles(p[0], r, g, 16).cast(dtypes.float32),
        lambda p, r, g: (_f32(p[1], r, g, 1).expand(r, g, 2), _f32(p[2], r, g, 1).expand(r, g, 2)),
    ),
    # chunk c of 32 bytes holds sub-block 2c in its low nibbles and 2c+1 in its high ones, each with its scale
    12: QuantFormat(
        2,
        32,
        _q4_k_planes,
        lambda p, r, g: _nibbles(p[0], r, g, 32).cast(dtypes.float32),
        lambda p, r, g: (_f32(p[1], r, g, 2), _f32(p[2], r, g, 2)),
    ),
    14: QuantFormat(
        4,
        16,
        _q6_k_planes,
        _q6_k_values,
        lambda p, r, g: (_f32(p[2], r, g // 2, 4, 2).permute(0, 1, 3, 2), None),
        _q6_k_x,
        lambda w: w.permute(0, 1, 3, 2, 4),
    ),
}


# parts a matvec's inner loop unrolls, when consecutive groups fold into one: the inner loop's vector sum is
# reduced to one value per fold, so a fold of a whole 768-wide row runs ~1.4x faster than one of 4 parts (measured,
# one thread, Q8_0/Q4_K/Q4_0, 768..32000 rows)
MAX_PARTS = 48


def quantize_blocks(x: Tensor, dtype: DType = dtypes.int8) -> tuple[Tensor, Tensor, Tensor]:
    """x (n, cols) as llama.cpp's 8-bit activations: per block of 32, (xq (n, blocks, 32) values -127..127 held in
    dtype (int8, or int16 for a target that multiplies 16-bit pairs: see dot_activations), the scale (n, blocks)
    float32 with x ~ scale * xq, the sum of xq (n, blocks) as float32). Each is realized by its own kernel
    (a matvec reads them once per weight row), and each holds what the matvec would otherwise compute per row (a
    Python number in a kernel is a buffer load, which hides its value from the C renderer's overflow proof)."""
    xb = x.cast(dtypes.float32).reshape(x.shape[0], -1, 32)
    xs = (xb.abs().max(-1) * (1 / 127)).contiguous()
    scaled = (xs > 0).unsqueeze(-1).where(xb / xs.unsqueeze(-1), 0.0)
    # rounded half away from zero by the truncating cast (round()'s ties-to-even is ~30 ops a value, unvectorized)
    xq = (scaled + (scaled < 0).where(-0.5, 0.5)).cast(dtype).contiguous()
    return xq, xs, xq.cast(dtypes.int32).sum(-1).cast(dtypes.float32).contiguous()


def _q8_0_dot(planes: tuple[Tensor, ...], xq: Tensor, xs: Tensor, xsum: Tensor) -> Tensor:
    # the weights stored as w + 128 (unsigned, what vpdpbusd multiplies): 128 * sum(xq) comes off each block's sum
    wu, ws = planes
    rows = wu.shape[0]
    isum = (wu.reshape(1, rows, -1, 32).cast(dtypes.int32) * xq.unsqueeze(1).cast(dtypes.int32)).sum(-1)
    true = isum.cast(dtypes.float32) - xsum.unsqueeze(1) * 128
    return (true * (ws.cast(dtypes.float32).unsqueeze(0) * xs.unsqueeze(1))).sum(-1)


def _q8_0_signed_dot(planes: tuple[Tensor, ...], xq: Tensor, xs: Tensor, xsum: Tensor) -> Tensor:
    # 16-bit activations: the weights stay signed (widened by vpmovsxbw), so no 128 * sum(xq) comes off a block
    w, ws = planes
    rows = w.shape[0]
    isum = (w.reshape(1, rows, -1, 32).cast(dtypes.int32) * xq.unsqueeze(1).cast(dtypes.int32)).sum(-1)
    return (isum.cast(dtypes.float32) * (ws.unsqueeze(0) * xs.unsqueeze(1))).sum(-1)


def _q4_k_dot(planes: tuple[Tensor, ...], xq: Tensor, xs: Tensor, xsum: Tensor) -> Tensor:
    # sub-block s of 32 holds nibbles q 0..15 (unsigned, what vpdpbusd multiplies) meaning scale_s * q + offset_s, so
    # its part of x @ w is xs_s * (scale_s * sum(q * xq) + offset_s * sum(xq)): integer sums, then float per block
    packed, scale, offset = planes
    rows, chunks = packed.shape[0], packed.shape[1] // 32
    # broadcast over x's rows before unpacking: a broadcast nibble unpack counts as recomputed per row, and the
    # scheduler would realize the whole unpacked matrix for a chunk of several rows (~2x slower at 8 rows)
    p = packed.reshape(1, rows, chunks, 32).expand(xq.shape[0], rows, chunks, 32)
    xq = xq.reshape(-1, 1, chunks, 2, 32).cast(dtypes.int32)
    scale, offset = scale.reshape(1, rows, chunks, 2), offset.reshape(1, rows, chunks, 2)
    xs, xsum = xs.reshape(-1, 1, chunks, 2), xsum.reshape(-1, 1, chunks, 2)
    out = None
    # chunk c's low nibbles are sub-block 2c, its high ones 2c+1: two sums over one load of its bytes, each nibble
    # unpacked in 8 bits (GCC then finds the dot product; one sum over both parts selects per byte, ~25 % slower)
    for part, q in enumerate((p & 15, p >> 4)):
        isum = (q.cast(dtypes.int32) * xq[:, :, :, part]).sum(-1).cast(dtypes.float32)
        term = (isum * scale[..., part] + offset[..., part] * xsum[..., part]) * xs[..., part]
        out = term if out is None else out + term
    return out.sum(-1)


def _q8_0_unsigned_planes(b: Tensor) -> tuple[Tensor, ...]:
    values = (b[:, 2:34].bitcast(dtypes.int8).cast(dtypes.int32) + 128).cast(dtypes.uint8)
    return values.contiguous(), _f16_plane(b, 0).contiguous()


@dataclass(frozen=True)
class DotFormat:
    """A ggml type multiplied in integer dot products: `format` its planes (values as unsigned 8-bit: the operand
    vpdpbusd takes unsigned) and how dequantize and prefill read them; `matvec(planes, xq, xs, xsum)` is x @ W.T over
    quantize_blocks' activations."""

    format: QuantFormat
    matvec: Callable[..., Tensor]


DOT_FORMATS: dict[int, DotFormat] = {
    8: DotFormat(
        QuantFormat(
            1,
            32,
            _q8_0_unsigned_planes,
            lambda p, r, g: (p[0].reshape(r, g, 1, 32).cast(dtypes.int32) - 128).cast(dtypes.float32),
            lambda p, r, g: (_f32(p[1], r, g, 1), None),
        ),
        _q8_0_dot,
    ),
    # Q4_K's nibbles are unsigned already: its float planes serve (unpacked in bytes, GCC finds the dot product)
    12: DotFormat(QUANT_FORMATS[12], _q4_k_dot),
}


def dot_activations(device: str) -> DType | None:
    """The dtype an integer matvec on device holds its 8-bit activations in: int8 where its kernels have 8-bit dot
    products (`int8_dot`); int16 where they multiply 16-bit pairs into 32-bit sums (`int16_dot`: GCC widens 8-bit
    weights and finds vpmaddwd against 16-bit activations, but multiplies two 8-bit operands in 16-bit lanes and
    widens each product); None: no integer matvec pays, the float one is used."""
    from fusegrad.engine.realize import int8_dot, int16_dot  # the engine entry points the tensor has loaded

    if int8_dot(device):
        return dtypes.int8
    return dtypes.int16 if int16_dot(device) else None


# the formats a matvec multiplies against 16-bit activations (int16_dot), where they differ from DOT_FORMATS': Q8_0
# keeps its signed values, with its scales as float32 (a float16 scale is two more instructions per block of 32 in
# a sum bound by instructions, not bytes)
INT16_DOT_FORMATS: dict[int, DotFormat] = {
    8: DotFormat(
        QuantFormat(
            1,
            32,
            lambda b: (b[:, 2:34].bitcast(dtypes.int8).contiguous(), _f16_at(b, 0).contiguous()),
            QUANT_FORMATS[8].values,
            QUANT_FORMATS[8].scales,
        ),
        _q8_0_signed_dot,
    ),
}


def _avx2_kernel(device: str, ggml_type: int, cols: int) -> bool:
    """Whether device's matvec of this type and width runs nn/quantized_avx2.py's kernel (`u8s8_pair_dot`)."""
    from fusegrad.nn.quantized_avx2 import avx2_kernels, has_avx2_matvec

    return avx2_kernels(device) and has_avx2_matvec(ggml_type, cols)


def _dot_format(ggml_type: int, activations: DType) -> DotFormat:
    return (INT16_DOT_FORMATS if activations == dtypes.int16 else {}).get(ggml_type, DOT_FORMATS[ggml_type])


def _format_of(ggml_type: int, integer: bool, activations: DType = dtypes.int8) -> QuantFormat:
    """The planes' format: the dot format's for integer planes, else QUANT_FORMATS'."""
    return _dot_format(ggml_type, activations).format if integer else QUANT_FORMATS[ggml_type]


class QuantizedMatrix:
    """A (rows, cols) quantized weight as planes (see the module doc), made once from its GGML blocks.
    `matvec(x)` is x @ W.T for x (n, cols) in one kernel that reads the planes; `dequantize()` is W in float32.
    On a target with integer dot products (`dot_activations`) a format in DOT_FORMATS multiplies x quantized to 8 bits
    per block of 32 (quantize_blocks) instead, in integers, as llama.cpp does."""

    def __init__(
        self,
        name: str,
        ggml_type: int,
        shape: tuple[int, int],
        planes: tuple[Tensor, ...],
        integer: bool = False,
        activations: DType = dtypes.int8,
        avx2: bool = False,
    ):
        """integer: the planes are DOT_FORMATS' (a decode row is multiplied in integer dot products); activations:
        the dtype that matvec's quantized x is held in (dot_activations); avx2: that matvec is the AVX2 kernel of
        nn/quantized_avx2.py, which quantizes x itself."""
        self.name, self.ggml_type, self.shape, self.planes, self.integer = name, ggml_type, shape, planes, integer
        self.activations, self.avx2 = activations, avx2
        self.format = _format_of(ggml_type, integer, activations)
        self.groups = shape[1] // self.format.group

    @staticmethod
    def from_ggml(w: GGMLQuantized, int8: bool | None = None, activations: DType | None = None) -> QuantizedMatrix:
        """int8: the integer planes, where the format has them (None: where also the target has integer dot products,
        `dot_activations`, and QUANT_DOT is on); activations: their matvec's activation dtype (None: the target's,
        int8 where it has none)."""
        if len(w.shape) != 2:
            raise ValueError(f"{w.name}: a quantized matrix is 2-D, got shape {w.shape}")
        if w.ggml_type not in QUANT_FORMATS:
            raise ValueError(f"{w.name}: no quantized matrix for {w.type_name}; supported: {_names()}")
        rows = w.shape[0]
        blocks = _on_compute_device(w.blocks).reshape(-1, GGML_TYPES[w.ggml_type][2])
        target = dot_activations(blocks.device)
        if int8 is None:
            int8 = bool(QUANT_DOT.value) and target is not None
        integer = int8 and w.ggml_type in DOT_FORMATS and w.shape[1] % 32 == 0
        activations = activations or target or dtypes.int8
        fmt = _format_of(w.ggml_type, integer, activations)
        # each plane holds rows in order: the first dim of its (blocks, ...) shape splits into rows
        planes = tuple(p.reshape(rows, -1).realize() for p in fmt.planes(blocks))
        # on 16-bit activations (no 8-bit dot products) an AVX2 C target takes the hand-written kernel: its planes
        # are the int16 path's
        avx2 = integer and activations == dtypes.int16 and _avx2_kernel(blocks.device, w.ggml_type, w.shape[1])
        if avx2 and w.ggml_type == 12:  # its kernel reads the stored scales (after the planes a prefill reads)
            planes += tuple(p.reshape(rows, -1).realize() for p in _q4_k_stored_scales(blocks))
        return QuantizedMatrix(w.name, w.ggml_type, w.shape, planes, integer, activations, avx2)  # type: ignore[arg-type]

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.ggml_type][0]

    @property
    def shares_blocks(self) -> bool:
        """Whether matvec takes x quantized by quantize_blocks (made once for the matrices reading the same x); the
        AVX2 kernel quantizes x itself."""
        return self.integer and not self.avx2

    def nbytes(self) -> int:
        return sum(p.nbytes() for p in self.planes)

    def _weights(self) -> Tensor:
        """(rows, *groups, parts, lanes) float32 weights, in the order of format.x_order."""
        rows, g = self.shape[0], self.groups
        values = self.format.values(self.planes, rows, g)
        scale, offset = self.format.scales(self.planes, rows, g)
        w = values * scale.unsqueeze(-1)
        return w if offset is None else w + offset.unsqueeze(-1)

    def dequantize(self) -> Tensor:
        w = self._weights()
        if self.format.columns is not None:
            w = self.format.columns(w)
        return w.reshape(self.shape)

    def panels(self) -> Tensor:
        """W dequantized into (ceil(rows / panel), cols, panel) float32 panels: panel p holds W rows p*panel ..
        p*panel+panel-1 as columns, contiguous over cols (zero columns pad the last), written in one kernel."""
        from fusegrad.engine.realize import panel_columns  # the engine entry point the tensor has loaded

        panel = panel_columns(self.planes[0].device) or 1  # 1: a target without panel tiles gets the plain Wᵀ
        if self.avx2 and panels_fit(self.ggml_type, *self.shape, panel):
            return avx2_panels(self.ggml_type, self.planes, self.shape, panel)
        w = self.dequantize()
        if pad := -self.shape[0] % panel:
            w = w.pad(((0, pad), (0, 0)))
        return w.reshape(-1, panel, self.shape[1]).permute(0, 2, 1).contiguous()

    def matmul(self, x: Tensor) -> Tensor:
        """x (n, cols) @ W.T -> (n, rows) for a chunk of many rows: W is dequantized once into panels (`panels`), and
        a register tile of rows of x by one panel's columns walks each panel down its contiguous cols."""
        if x.ndim != 2 or x.shape[1] != self.shape[1]:
            raise ValueError(f"{self.name}: x of shape {x.shape} cannot multiply a weight of shape {self.shape}")
        panels = self.panels()
        count, k, panel = panels.shape
        out = (x.cast(dtypes.float32).reshape(-1, 1, 1, k) * panels.permute(0, 2, 1)).sum(-1)
        if count * panel != self.shape[0]:  # padded panels: the sum is realized whole (a narrower store loses the tile)
            out = out.contiguous()
        return out.reshape(-1, count * panel)[:, : self.shape[0]]

    def matvec(self, x: Tensor, blocks: tuple[Tensor, Tensor, Tensor] | None = None) -> Tensor:
        """x (n, cols) @ W.T -> (n, rows): per row and group, each lane's parts dequantized and multiplied by x,
        summed over the group's contiguous lanes in an inner loop, then over the groups. With dot planes, x is
        quantized per block (quantize_blocks; `blocks` passes those of this x made once for several matrices)."""
        if x.ndim != 2 or x.shape[1] != self.shape[1]:
            raise ValueError(f"{self.name}: x of shape {x.shape} cannot multiply a weight of shape {self.shape}")
        if self.avx2:
            from fusegrad.nn.quantized_avx2 import avx2_matvec

            return avx2_matvec(self.ggml_type, self.planes, x)
        if self.integer:
            dot = _dot_format(self.ggml_type, self.activations)
            return dot.matvec(self.planes, *(blocks or quantize_blocks(x, self.activations)))
        fmt, w, x = self.format, self._weights(), x.cast(dtypes.float32)
        if fmt.x_order is not None:
            xg = fmt.x_order(x, self.groups)
        else:  # consecutive groups fold into one with more parts: fewer horizontal sums of the inner loop's vectors
            fold = max(f for f in range(1, max(MAX_PARTS // fmt.parts, 1) + 1) if self.groups % f == 0)
            w = w.reshape(self.shape[0], self.groups // fold, fold * fmt.parts, fmt.lanes)
            xg = x.reshape(x.shape[0], 1, self.groups // fold, fold * fmt.parts, fmt.lanes)
        terms = w.unsqueeze(0) * xg
        # the parts as separate terms, so the inner loop is over lanes only and each part's scale stays in a register
        lanes = terms[..., 0, :]
        for p in range(1, terms.shape[-2]):
            lanes = lanes + terms[..., p, :]
        return lanes.sum(-1).sum(tuple(range(2, lanes.ndim - 1)))

    def __repr__(self) -> str:
        return f"<QuantizedMatrix {self.name} {self.type_name} {self.shape}>"
