"""Small pure utilities and the one place environment flags are read (see README's env-var table)."""
from __future__ import annotations
import contextlib, functools, math, os, time
from typing import Any, Iterable, Sequence, TypeVar

T = TypeVar("T")

def prod(xs: Iterable[Any], start: Any = 1) -> Any:
  return functools.reduce(lambda a, b: a * b, xs, start)

def all_same(xs: Sequence[Any]) -> bool: return all(x == xs[0] for x in xs)

def argfix(*args: Any) -> tuple:
  """Accept f(2, 3), f((2, 3)) and f([2, 3]) alike."""
  if len(args) == 1 and isinstance(args[0], (tuple, list)): return tuple(args[0])
  return tuple(args)

def dedup(xs: Iterable[T]) -> list[T]: return list(dict.fromkeys(xs))

def flatten(xss: Iterable[Iterable[T]]) -> list[T]: return [x for xs in xss for x in xs]

def ceildiv(a: int, b: int) -> int: return -(-a // b)

def round_up(x: int, multiple: int) -> int: return ceildiv(x, multiple) * multiple

@functools.cache
def getenv(key: str, default: Any = 0) -> Any:
  """Read an environment variable once, converted to type(default); a bad value names the variable."""
  raw = os.environ.get(key)
  if raw is None: return default
  try: return type(default)(raw)
  except ValueError: raise ValueError(f"environment variable {key}={raw!r} is not a valid {type(default).__name__}") from None

class ContextVar:
  """A configuration value read from the environment at import, overridable with Context(NAME=value)."""
  registry: dict[str, ContextVar] = {}
  def __init__(self, key: str, default: Any):
    self.key, self.value = key, getenv(key, default)
    ContextVar.registry[key] = self
  def __bool__(self) -> bool: return bool(self.value)
  def __ge__(self, x: Any) -> bool: return self.value >= x
  def __gt__(self, x: Any) -> bool: return self.value > x
  def __lt__(self, x: Any) -> bool: return self.value < x
  def __le__(self, x: Any) -> bool: return self.value <= x
  def __eq__(self, x: Any) -> bool: return self.value == x
  def __hash__(self) -> int: return hash(self.key)
  def __int__(self) -> int: return int(self.value)
  def __repr__(self) -> str: return f"ContextVar({self.key}={self.value!r})"

class Context(contextlib.ContextDecorator):
  """Temporarily override ContextVars: `with Context(DEBUG=2): ...` or as a decorator."""
  def __init__(self, **kwargs: Any):
    unknown = [k for k in kwargs if k not in ContextVar.registry]
    if unknown: raise KeyError(f"unknown context variable(s) {unknown}; known: {sorted(ContextVar.registry)}")
    self.kwargs = kwargs
  def __enter__(self):
    self.old = {k: ContextVar.registry[k].value for k in self.kwargs}
    for k, v in self.kwargs.items(): ContextVar.registry[k].value = v
    return self
  def __exit__(self, *exc: Any) -> None:
    for k, v in self.old.items(): ContextVar.registry[k].value = v

DEBUG = ContextVar("DEBUG", 0)
DEV = ContextVar("DEV", "")
TRAINING = ContextVar("TRAINING", 0)
DEFAULT_FLOAT = ContextVar("DEFAULT_FLOAT", "float32")
DEFAULT_INT = ContextVar("DEFAULT_INT", "int32")
SUM_DTYPE = ContextVar("SUM_DTYPE", "")  # minimum float accumulation dtype of sum ("" = the input dtype)
CACHELEVEL = ContextVar("CACHELEVEL", 2)
NUM_CPU_THREADS = ContextVar("NUM_CPU_THREADS", min(os.cpu_count() or 1, 8))
CC = ContextVar("CC", "")

def cache_dir() -> str:
  return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "fusegrad")

class GlobalCounters:
  """Process-wide counters of launched work."""
  global_ops: int = 0
  global_mem: int = 0
  time_sum_s: float = 0.0
  kernel_count: int = 0
  mem_used: int = 0
  mem_used_per_device: dict[str, int] = {}
  @staticmethod
  def reset() -> None:
    GlobalCounters.global_ops, GlobalCounters.global_mem, GlobalCounters.time_sum_s, GlobalCounters.kernel_count = 0, 0, 0.0, 0

class Timing(contextlib.ContextDecorator):
  """Print the elapsed time of a block in ms."""
  def __init__(self, prefix: str = "", on_exit: Any = None, enabled: bool = True):
    self.prefix, self.on_exit, self.enabled = prefix, on_exit, enabled
  def __enter__(self):
    self.st = time.perf_counter_ns()
    return self
  def __exit__(self, *exc: Any) -> None:
    self.et = time.perf_counter_ns() - self.st
    if self.enabled: print(f"{self.prefix}{self.et*1e-6:6.2f} ms" + (self.on_exit(self.et) if self.on_exit else ""))

def to_function_name(s: str) -> str: return "".join(c if c.isalnum() or c == "_" else "_" for c in s)

def is_pow2(x: int) -> bool: return x > 0 and (x & (x - 1)) == 0

def log2_int(x: int) -> int: return int(math.log2(x))
