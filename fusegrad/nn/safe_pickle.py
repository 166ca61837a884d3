"""A restricted unpickler for checkpoints: at least as strict as torch.load(weights_only=True).

It runs pickle's pure-Python opcode loop with its own opcode table, so each opcode that could reach outside the data
is checked: globals come only from an allow-list, BUILD sets state only on objects this load created (OrderedDicts,
numpy arrays and dtypes, never a global), SETITEMS/APPENDS/ADDITEMS fill only dicts, lists and sets, and numpy values
are rebuilt only for plain numeric dtypes. Reads are bounded by the bytes actually there: no length field can make it
allocate memory the file does not hold.
"""

from __future__ import annotations

import _compat_pickle
import collections
import pickle
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from fusegrad.helpers import prod

MAX_RANK = 64  # more dims than any framework stores; a larger rank is a crafted file
# hashing a tuple recurses in C without a depth check: a million nested tuples used as a dict key crash the process
MAX_TUPLE_NESTING = 100


class _Opcodes(dict):
    def __missing__(self, code: int) -> Callable[[Any], None]:
        def refuse(unpickler: Any) -> None:
            raise pickle.UnpicklingError(f"{unpickler.name}: pickle opcode {bytes([code])!r} is not allowed")

        return refuse


class PickleSource:
    """read/readline over bytes [start, end) of a blob-like object (anything with `read(start, n, what)`), refusing
    any read past the end instead of returning short data or allocating what a length field claims."""

    def __init__(self, blob: Any, name: str, start: int = 0, end: int | None = None):
        self.blob, self.name, self.pos, self.end = blob, name, start, len(blob) if end is None else end

    def read(self, n: int) -> bytes:
        if n < 0 or n > self.end - self.pos:
            raise pickle.UnpicklingError(
                f"{self.name}: pickle data truncated: needs {n} bytes at offset {self.pos}, {self.end - self.pos} left"
            )
        out = self.blob.read(self.pos, n, "pickle data")
        self.pos += n
        return out

    def readline(self) -> bytes:
        line = b""
        while not line.endswith(b"\n"):
            if self.pos >= self.end:
                raise pickle.UnpicklingError(f"{self.name}: pickle data truncated inside a text line")
            chunk = self.blob.read(self.pos, min(256, self.end - self.pos), "pickle data")
            cut = chunk.find(b"\n")
            chunk = chunk if cut < 0 else chunk[: cut + 1]
            line, self.pos = line + chunk, self.pos + len(chunk)
        return line


_PLAIN_NUMPY = re.compile(r"[<>=|]?([biufc])(\d{1,2})")


def _plain_numpy_dtype(x: Any, name: str) -> np.dtype:
    if (
        not isinstance(x, np.dtype)
        or x.kind not in "biufc"
        or x.hasobject
        or x.fields is not None
        or x.subdtype is not None
    ):
        raise pickle.UnpicklingError(f"{name}: numpy dtype {x!r} refused: only plain numeric dtypes are allowed")
    return x


def _int_tuple(x: Any, what: str, name: str) -> tuple[int, ...]:
    if (
        not isinstance(x, (tuple, list))
        or len(x) > MAX_RANK
        or not all(type(d) is int and d >= 0 for d in x)
        or prod(max(d, 1) for d in x) >= 1 << 62
    ):
        raise pickle.UnpicklingError(f"{name}: {what} {x!r} is not a tuple of at most {MAX_RANK} non-negative ints")
    return tuple(x)


_NDARRAY = object()  # what `numpy.ndarray` unpickles to: only _reconstruct may use it, nothing can call it


class RestrictedUnpickler(pickle._Unpickler):  # type: ignore[name-defined]
    """Unpickles plain values (numbers, strings, bytes, lists, tuples, dicts, sets, OrderedDicts), numpy arrays and
    scalars of plain numeric dtypes, and whatever `extra` maps (module, name) to. Everything else raises
    pickle.UnpicklingError naming the file."""

    dispatch = _Opcodes()

    def __init__(self, source: Any, name: str, extra: dict[tuple[str, str], Any] | None = None, **kwargs: Any):
        """`source`: a PickleSource (reads bounded by the data), or any binary file with read() and readline();
        kwargs (encoding, errors) as for pickle.Unpickler."""
        super().__init__(source, **kwargs)
        self.name = name
        self.allowed = {**self._base_globals(), **(extra or {})}
        self.fresh: dict[int, Any] = {}  # id -> numpy arrays and dtypes made by this load that await their BUILD
        self.nesting: dict[int, tuple[tuple, int]] = {}  # id -> (tuple, how deeply tuples nest in it)

    def load(self) -> Any:
        try:
            return super().load()
        except (pickle.UnpicklingError, EOFError):
            raise
        except Exception as e:  # a crafted pickle may break any opcode: the caller sees one exception type
            msg = str(e) if str(e).startswith(self.name) else f"{self.name}: corrupt pickle ({type(e).__name__}): {e}"
            raise pickle.UnpicklingError(msg) from e

    def _base_globals(self) -> dict[tuple[str, str], Any]:
        out: dict[tuple[str, str], Any] = {
            ("collections", "OrderedDict"): collections.OrderedDict,
            ("builtins", "set"): set,
            ("builtins", "frozenset"): frozenset,
            ("builtins", "slice"): slice,
            ("builtins", "complex"): complex,
            ("_codecs", "encode"): self._encode,
            ("torch", "Size"): tuple,
            ("torch", "device"): str,
            ("numpy", "ndarray"): _NDARRAY,
            ("numpy", "dtype"): self._numpy_dtype,
        }
        for mod in ("numpy.core.multiarray", "numpy._core.multiarray"):
            out |= {(mod, "_reconstruct"): self._numpy_reconstruct, (mod, "scalar"): self._numpy_scalar}
        return out

    def find_class(self, module: str, name: str) -> Any:
        if self.proto < 3:  # protocol 2 pickles name Python 2 modules (__builtin__.set); map them as pickle does
            module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
            module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        if (module, name) in self.allowed:
            return self.allowed[(module, name)]
        raise pickle.UnpicklingError(
            f"{self.name}: refusing to load global {module}.{name}: only tensors, storages, plain "
            "containers and numpy values are allowed"
        )

    # ---- the allowed constructors, each checking its arguments

    def _encode(self, text: Any, encoding: str = "utf-8") -> bytes:
        # protocol 2 pickles bytes as _codecs.encode(str, 'latin1')
        if not isinstance(text, str) or encoding not in ("latin1", "latin-1", "utf-8", "utf8"):
            raise pickle.UnpicklingError(f"{self.name}: _codecs.encode({type(text).__name__}, {encoding!r}) refused")
        return text.encode(encoding)

    def _numpy_dtype(self, spec: Any, align: Any = False, copy: Any = True) -> np.dtype:
        spec = spec.decode("latin1") if isinstance(spec, bytes) else spec  # Python 2 pickles read with encoding="bytes"
        m = _PLAIN_NUMPY.fullmatch(spec) if isinstance(spec, str) else None
        if m is None:
            raise pickle.UnpicklingError(f"{self.name}: numpy dtype {spec!r} refused: only plain numeric dtypes")
        # always a new dtype object: BUILD may set its byte order, which must never reach numpy's shared instances
        out = _plain_numpy_dtype(np.dtype(spec, copy=True), self.name)
        self.fresh[id(out)] = out
        return out

    def _numpy_reconstruct(self, subtype: Any, shape: Any, typecode: Any) -> np.ndarray:
        if subtype is not _NDARRAY or shape != (0,):
            raise pickle.UnpicklingError(f"{self.name}: numpy _reconstruct({subtype!r}, {shape!r}) refused")
        out = np.ndarray((0,), np.uint8)
        self.fresh[id(out)] = out
        return out

    def _numpy_scalar(self, dtype: Any, data: Any) -> Any:
        dtype = _plain_numpy_dtype(dtype, self.name)
        if not isinstance(data, bytes) or len(data) != dtype.itemsize:
            raise pickle.UnpicklingError(f"{self.name}: numpy scalar of {dtype} needs {dtype.itemsize} bytes")
        return np.frombuffer(data, dtype)[0]

    # ---- opcodes that would otherwise reach outside the data

    def _build(self) -> None:
        state, inst = self.stack.pop(), self.stack[-1]
        if type(inst) is collections.OrderedDict and isinstance(state, dict) and all(isinstance(k, str) for k in state):
            inst.__dict__.update(state)  # torch's state dicts carry a `_metadata` attribute
        elif self.fresh.get(id(inst)) is inst and isinstance(inst, np.ndarray):
            del self.fresh[id(inst)]
            inst.__setstate__(self._array_state(state))
        elif self.fresh.get(id(inst)) is inst and isinstance(inst, np.dtype):
            del self.fresh[id(inst)]
            if isinstance(state, tuple) and len(state) == 8 and isinstance(state[1], bytes):
                state = (state[0], state[1].decode("latin1"), *state[2:])
            if not (
                isinstance(state, tuple) and len(state) == 8 and state[0] == 3 and state[1] in ("<", ">", "=", "|")
            ):
                raise pickle.UnpicklingError(f"{self.name}: numpy dtype state {state!r} refused")
            if state[2:] != (None, None, None, -1, -1, 0):
                raise pickle.UnpicklingError(f"{self.name}: numpy dtype state {state!r} is not a plain numeric dtype")
            inst.__setstate__(state)
        else:
            raise pickle.UnpicklingError(
                f"{self.name}: refusing to set the state of a {type(inst).__name__} (BUILD): only OrderedDicts and "
                "numpy values made by this file may be given state"
            )

    def _array_state(self, state: Any) -> tuple:
        if not (isinstance(state, tuple) and len(state) == 5 and state[0] == 1):
            raise pickle.UnpicklingError(f"{self.name}: numpy array state of type {type(state).__name__} refused")
        _, shape, dtype, fortran, data = state
        shape, dtype = _int_tuple(shape, "numpy array shape", self.name), _plain_numpy_dtype(dtype, self.name)
        if not isinstance(fortran, bool) or not isinstance(data, bytes) or len(data) != prod(shape) * dtype.itemsize:
            raise pickle.UnpicklingError(
                f"{self.name}: numpy array of shape {shape} and dtype {dtype} needs {prod(shape) * dtype.itemsize} "
                f"bytes of data, got {type(data).__name__} of {len(data) if isinstance(data, bytes) else '?'}"
            )
        return (1, shape, dtype, fortran, data)

    def _tuple_nesting(self, t: tuple) -> int:
        if (known := self.nesting.get(id(t))) is not None and known[0] is t:
            return known[1]
        inner = [x for x in t if type(x) is tuple]
        depth = 1 + max((self._tuple_nesting(x) for x in inner), default=0)
        if depth > MAX_TUPLE_NESTING:
            raise pickle.UnpicklingError(f"{self.name}: tuples nest more than {MAX_TUPLE_NESTING} deep")
        self.nesting[id(t)] = (t, depth)
        return depth

    def _target(self, kinds: tuple[type, ...], opcode: str, at: int = -1) -> Any:
        target = self.stack[at]
        if type(target) not in kinds:
            raise pickle.UnpicklingError(f"{self.name}: {opcode} into a {type(target).__name__} refused")
        return target

    def _setitem(self) -> None:
        value, key = self.stack.pop(), self.stack.pop()
        self._target((dict, collections.OrderedDict), "SETITEM")[key] = value

    def _setitems(self) -> None:
        items = self.pop_mark()
        target = self._target((dict, collections.OrderedDict), "SETITEMS")
        if len(items) % 2:
            raise pickle.UnpicklingError(f"{self.name}: SETITEMS with an odd number of items")
        for i in range(0, len(items), 2):
            target[items[i]] = items[i + 1]

    def _append(self) -> None:
        value = self.stack.pop()
        self._target((list,), "APPEND").append(value)

    def _appends(self) -> None:
        items = self.pop_mark()
        self._target((list,), "APPENDS").extend(items)

    def _additems(self) -> None:
        items = self.pop_mark()
        self._target((set,), "ADDITEMS").update(items)

    def _newobj(self) -> None:
        args, cls = self.stack.pop(), self.stack.pop()
        if cls not in (complex, set, frozenset, collections.OrderedDict) or not isinstance(args, tuple):
            raise pickle.UnpicklingError(f"{self.name}: NEWOBJ of {cls!r} refused")
        self.append(cls.__new__(cls, *args))

    def _newobj_ex(self) -> None:
        kwargs = self.stack.pop()
        if kwargs != {}:
            raise pickle.UnpicklingError(f"{self.name}: NEWOBJ_EX with keyword arguments refused")
        self._newobj()


_SAFE_OPCODES = (
    "MARK STOP POP POP_MARK DUP FLOAT INT BININT BININT1 LONG BININT2 NONE PERSID BINPERSID REDUCE STRING BINSTRING "
    "SHORT_BINSTRING UNICODE BINUNICODE GLOBAL DICT EMPTY_DICT GET BINGET LONG_BINGET LIST EMPTY_LIST PUT BINPUT "
    "LONG_BINPUT TUPLE EMPTY_TUPLE BINFLOAT TRUE FALSE PROTO TUPLE1 TUPLE2 TUPLE3 NEWTRUE NEWFALSE LONG1 LONG4 "
    "BINBYTES SHORT_BINBYTES BINUNICODE8 SHORT_BINUNICODE BINBYTES8 EMPTY_SET FROZENSET STACK_GLOBAL MEMOIZE FRAME"
)
RestrictedUnpickler.dispatch.update(
    {getattr(pickle, op)[0]: pickle._Unpickler.dispatch[getattr(pickle, op)[0]] for op in _SAFE_OPCODES.split()}  # type: ignore[attr-defined]
)


def _measuring_tuples(load: Callable[[Any], None]) -> Callable[[Any], None]:
    """The opcode, then a check of how deeply tuples nest in a tuple it pushed (each new tuple's items are already
    measured, so this is one step per item, never a deep recursion)."""

    def run(self: RestrictedUnpickler) -> None:
        load(self)
        if type(top := self.stack[-1]) is tuple:
            self._tuple_nesting(top)

    return run


RestrictedUnpickler.dispatch.update(
    {
        getattr(pickle, op)[0]: _measuring_tuples(pickle._Unpickler.dispatch[getattr(pickle, op)[0]])  # type: ignore[attr-defined]
        for op in ("TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "EMPTY_TUPLE", "REDUCE")
    }
)
RestrictedUnpickler.dispatch.update(
    {
        pickle.BUILD[0]: RestrictedUnpickler._build,
        pickle.SETITEM[0]: RestrictedUnpickler._setitem,
        pickle.SETITEMS[0]: RestrictedUnpickler._setitems,
        pickle.APPEND[0]: RestrictedUnpickler._append,
        pickle.APPENDS[0]: RestrictedUnpickler._appends,
        pickle.ADDITEMS[0]: RestrictedUnpickler._additems,
        pickle.NEWOBJ[0]: RestrictedUnpickler._newobj,
        pickle.NEWOBJ_EX[0]: RestrictedUnpickler._newobj_ex,
    }
)

__all__ = ["MAX_RANK", "PickleSource", "RestrictedUnpickler"]
