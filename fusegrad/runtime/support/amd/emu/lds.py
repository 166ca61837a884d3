"""DS instructions: the workgroup's LDS (`m.lds`, bytes) read, written and updated atomically by every on lane at once.

Addresses are the `addr` VGPR plus the instruction's 16-bit offset (offset1 << 8 | offset0); the two-address forms
(`ds_read2*`, `ds_write2*`, `ds_wrxchg2*`) use offset0 and offset1 separately, in units of the element size, times 64
for the `st64` forms (CDNA3 ISA, "Data Share Operations"). An access past the workgroup's allocation stops the
dispatch (`LDSFault`) rather than reading zeros, so a kernel that misjudges its LDS size is never silently wrong.

Atomics apply in lane order: when every on lane has its own address, one numpy call updates all of them; lanes that
share an address run one after another, each seeing the previous lane's result (as the returned pre-op values of the
`_rtn` forms show). Bank conflicts cost nothing here: the emulator has no timing.
"""

from __future__ import annotations

import numpy as np

from .machine import Machine, Unsupported

U8, U16, U32, U64 = np.uint8, np.uint16, np.uint32, np.uint64
INT = {32: np.int32, 64: np.int64}
UINT = {32: np.uint32, 64: np.uint64}
FLOAT = {32: np.float32, 64: np.float64}
READS = {"b32": 4, "b64": 8, "b96": 12, "b128": 16}
WRITES = {"b8": 1, "b16": 2, "b32": 4, "b64": 8, "b96": 12, "b128": 16}
NARROW_READS = {"u8": U8, "i8": np.int8, "u16": U16, "i16": np.int16}


ALL = slice(None)
AR = [np.arange(n) for n in range(17)]


class LDSFault(Exception):
    """An LDS access outside the workgroup's allocation."""


def _cmpst(old, a, b, kind):
    same = old.view(FLOAT[old.dtype.itemsize * 8]) == a.view(FLOAT[a.dtype.itemsize * 8]) if kind == "f" else old == a
    return np.where(same, b, old)


# what each atomic stores, from the old value and data0/data1 as unsigned arrays of the operation's width
ATOMICS = {
    "add": lambda old, a, b, k: old + a,
    "sub": lambda old, a, b, k: old - a,
    "rsub": lambda old, a, b, k: a - old,
    "inc": lambda old, a, b, k: np.where(old >= a, 0, old + 1).astype(old.dtype),
    "dec": lambda old, a, b, k: np.where((old == 0) | (old > a), a, old - 1).astype(old.dtype),
    "and": lambda old, a, b, k: old & a,
    "or": lambda old, a, b, k: old | a,
    "xor": lambda old, a, b, k: old ^ a,
    "mskor": lambda old, a, b, k: (old & ~a) | b,
    "wrxchg": lambda old, a, b, k: a + 0 * old,
    "cmpst": _cmpst,
}


def _minmax(fn, kind, old, a):
    bits = old.dtype.itemsize * 8
    t = {"i": INT, "u": UINT, "f": FLOAT}[kind][bits]
    if kind == "f":
        fn = {np.minimum: np.fmin, np.maximum: np.fmax}[fn]  # IEEE minNum/maxNum: a NaN operand loses
    return fn(old.view(t), a.view(t)).view(old.dtype)


ATOMICS["min"] = lambda old, a, b, k: _minmax(np.minimum, k, old, a)
ATOMICS["max"] = lambda old, a, b, k: _minmax(np.maximum, k, old, a)


def _fadd(old, a, b, k):
    t = FLOAT[old.dtype.itemsize * 8]
    return (old.view(t) + a.view(t)).view(old.dtype)


def _pk_add(kind):
    return (lambda old, a, b, k: _pk_f16(old, a)) if kind == "f16" else (lambda old, a, b, k: _pk_bf16(old, a))


def _pk_f16(old, a):
    x, y = old.view(np.float16).reshape(-1, 2), a.view(np.float16).reshape(-1, 2)
    return (x + y).reshape(-1).view(U32)


def _pk_bf16(old, a):
    x = (old.view(U16).astype(U32) << 16).view(np.float32)
    y = (a.view(U16).astype(U32) << 16).view(np.float32)
    s = (x + y).view(U32)
    rounded = ((s + 0x7FFF + ((s >> 16) & 1)) >> 16).astype(U16)  # round to nearest even
    rounded = np.where(np.isnan(x + y), U16(0x7FC0), rounded)
    return rounded.view(U32)


class _LDS:
    """Views of the register file and the LDS for one instruction."""

    def __init__(self, m: Machine, f: dict):
        self.m, self.V = m, m.V
        acc = 256 if f["acc"] else 0  # data and destination in AGPRs (after the 256 VGPRs in the register file)
        self.addr, self.d0, self.d1, self.vdst = f["addr"], acc + f["data0"], acc + f["data1"], acc + f["vdst"]
        self.off0, self.off1 = f["offset0"], f["offset1"]

    def lanes(self):
        """The on lanes as an index (a slice when all are on), or None when none is."""
        m = self.m
        if m.exec_full:
            return ALL
        ln = np.flatnonzero(m.exec_mask)
        return ln if ln.size else None

    def where(self, ln, offset: int, n: int) -> np.ndarray:
        a = self.V[ln, self.addr].astype(np.int64)
        if offset:
            a += offset
        size = self.m.lds.size
        if int(a.max()) + n > size:
            bad = int(a[a + n > size][0])
            raise LDSFault(f"LDS access of {n} bytes at {bad:#x}, outside the workgroup's {size}-byte allocation")
        return a

    def read(self, a: np.ndarray, n: int) -> np.ndarray:
        """(lanes, n) bytes; whole dwords at dword-aligned addresses are gathered as dwords."""
        if n % 4 == 0 and not int(np.bitwise_or.reduce(a)) & 3:
            words = self.m.lds.view(U32)
            q = a >> 2
            return (words[q] if n == 4 else words[q[:, None] + AR[n // 4]]).view(U8).reshape(len(a), n)
        return self.m.lds[a[:, None] + AR[n]]

    def write(self, a: np.ndarray, raw: np.ndarray) -> None:
        n = raw.shape[1]
        if n % 4 == 0 and not int(np.bitwise_or.reduce(a)) & 3:
            words, q = self.m.lds.view(U32), a >> 2
            data = np.ascontiguousarray(raw).view(U32)
            if n == 4:
                words[q] = data[:, 0]
            else:
                words[q[:, None] + AR[n // 4]] = data
            return
        self.m.lds[a[:, None] + AR[n]] = raw

    def regs(self, ln, reg: int, n: int) -> np.ndarray:
        """The low n bytes of VGPRs reg.. per lane, as (lanes, n) bytes."""
        return np.ascontiguousarray(self.V[ln, reg : reg + max(-(-n // 4), 1)]).view(U8)[:, :n]

    def put(self, ln, raw: np.ndarray) -> None:
        self.V[ln, self.vdst : self.vdst + raw.shape[1] // 4] = np.ascontiguousarray(raw).view(U32)


def compile_ds(m: Machine, inst, nxt: int):
    name, f = inst.name, inst.f
    if f.get("gds"):
        raise Unsupported("GDS (the global data share)")
    d = _LDS(m, f)
    offset = f["offset0"] | f["offset1"] << 8
    parts = name.split("_")
    if name == "ds_nop":
        return lambda: nxt
    if name.startswith(("ds_read2", "ds_write2")):
        return _pair(d, name, nxt)
    if name.startswith("ds_read_"):
        return _read(d, name, offset, nxt)
    if name.startswith("ds_write_") and parts[2] in WRITES and "addtid" not in name:
        return _write(d, name, offset, nxt)
    if name in ("ds_permute_b32", "ds_bpermute_b32"):
        return _permute(d, name == "ds_bpermute_b32", offset, nxt)
    return _atomic(d, name, offset, nxt)


def _read(d: _LDS, name: str, offset: int, nxt: int):
    kind = name.removeprefix("ds_read_")
    V = d.V
    if kind in READS:
        n = READS[kind]

        def read():
            ln = d.lanes()
            if ln is None:
                return nxt
            d.put(ln, d.read(d.where(ln, offset, n), n))
            return nxt

        return read
    base, d16, hi = kind.partition("_d16")
    if base not in NARROW_READS:
        raise Unsupported(name)
    t = NARROW_READS[base]
    n = np.dtype(t).itemsize
    half = 1 if hi == "_hi" else 0  # which 16-bit half a d16 load replaces (the other is kept)

    def read_narrow():
        ln = d.lanes()
        if ln is None:
            return nxt
        value = np.ascontiguousarray(d.read(d.where(ln, offset, n), n)).view(t)[:, 0].astype(np.int64)
        if d16:
            V.view(U16)[ln, 2 * d.vdst + half] = value.astype(U16)
        else:
            V[ln, d.vdst] = value.astype(U32)
        return nxt

    return read_narrow


def _write(d: _LDS, name: str, offset: int, nxt: int):
    kind = name.removeprefix("ds_write_")
    size, _, hi = kind.partition("_")
    n = WRITES[size]
    shift = 2 if hi == "d16_hi" else 0  # the d16_hi forms store the data's high half

    def write():
        ln = d.lanes()
        if ln is None:
            return nxt
        raw = np.ascontiguousarray(d.V[ln, d.d0]).view(U8).reshape(-1, 4)[:, shift : shift + n] if n < 4 else None
        d.write(d.where(ln, offset, n), raw if raw is not None else d.regs(ln, d.d0, n))
        return nxt

    return write


def _pair(d: _LDS, name: str, nxt: int):
    """ds_read2/ds_write2 (and st64): two elements at addr + offset0 * size and addr + offset1 * size."""
    n = 8 if name.endswith("b64") else 4
    unit = n * (64 if "st64" in name else 1)
    o0, o1 = d.off0 * unit, d.off1 * unit
    words = n // 4
    if name.startswith("ds_read2"):

        def read2():
            ln = d.lanes()
            if ln is None:
                return nxt
            first, second = d.read(d.where(ln, o0, n), n), d.read(d.where(ln, o1, n), n)
            d.put(ln, np.concatenate([first, second], axis=1))
            return nxt

        return read2

    def write2():
        ln = d.lanes()
        if ln is None:
            return nxt
        a0, a1 = d.where(ln, o0, n), d.where(ln, o1, n)
        d.write(a0, d.regs(ln, d.d0, 4 * words))
        d.write(a1, d.regs(ln, d.d1, 4 * words))
        return nxt

    return write2


def _permute(d: _LDS, backward: bool, offset: int, nxt: int):
    """Lane shuffles through the LDS crossbar (no LDS memory): bpermute reads lane (addr + offset) / 4 of data0,
    permute writes data0 to that lane; an off lane's data counts as 0."""
    V, m = d.V, d.m

    def permute():
        on = m.exec_mask
        lane = ((V[:, d.addr].astype(np.int64) + offset) >> 2) & 63
        src = np.where(on, V[:, d.d0], U32(0))
        out = np.zeros(64, U32)
        if backward:
            out[:] = src[lane]
        else:
            idx = np.flatnonzero(on)
            out[lane[idx]] = src[idx]  # numpy assigns in order: the highest lane wins a shared target
        V[on, d.vdst] = out[on]
        return nxt

    return permute


def _atomic(d: _LDS, name: str, offset: int, nxt: int):
    parts = name.removeprefix("ds_").split("_")
    rtn = "rtn" in parts
    parts = [p for p in parts if p != "rtn"]
    if len(parts) != 2 and not (parts[0] == "pk" and len(parts) == 3):
        raise Unsupported(name)
    if parts[0] == "pk":
        op, ty = _pk_add(parts[2]), "b32"
    else:
        base, ty = parts
        kind = ty[0]
        if base == "add" and kind == "f":
            op = _fadd
        elif base in ATOMICS:
            op = ATOMICS[base]
        else:
            raise Unsupported(name)
    bits = int(ty[1:])
    n, t, kind = bits // 8, UINT[bits], ty[0]
    words = n // 4

    def value(ln, reg):
        return np.ascontiguousarray(d.V[ln, reg : reg + words]).view(t)[:, 0]

    def atomic():
        ln = d.lanes()
        if ln is None:
            return nxt
        a = d.where(ln, offset, n)
        x, y = value(ln, d.d0), value(ln, d.d1)
        if np.unique(a).size == a.size:
            groups = [np.arange(a.size)]
        else:  # lanes sharing an address go one at a time, in lane order
            groups = [np.array([i]) for i in range(a.size)]
        old_all = np.empty(a.size, t)
        for g in groups:
            old = np.ascontiguousarray(d.read(a[g], n)).view(t)[:, 0]
            old_all[g] = old
            new = np.asarray(op(old, x[g], y[g], kind), t)
            d.write(a[g], new.view(U8).reshape(-1, n))
        if rtn:
            d.V[ln, d.vdst : d.vdst + words] = old_all.view(U32).reshape(-1, words)
        return nxt

    return atomic
