"""How fast a new process gets going, fusegrad vs tinygrad in the same run: `python bench/bench_start.py [runs]`.

Each measurement runs in a fresh subprocess (medians of `runs`, default 5, interleaved): `import` time as
`python -X importtime` reports it (cumulative time of the top-level package), and, with an empty kernel cache
(`XDG_CACHE_HOME` a new temporary folder), the wall time of the first 1024x1024 matmul of two uploaded numpy arrays
and of the first `Tensor.rand(1024, 1024).realize()` on CPU, each timed from after the import."""

from __future__ import annotations
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("fusegrad", "tinygrad")
FIRST_CALL = {
    "matmul": "a, b = (Tensor(rng.random((1024, 1024), dtype=np.float32)) for _ in range(2))\n(a @ b).realize()\n",
    "rand": "Tensor.rand(1024, 1024).realize()\n",
}


def import_seconds(package: str) -> float:
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"import {package}"],
        capture_output=True,
        text=True,
        check=True,
        env=_env(),
    ).stderr
    line = next(x for x in out.splitlines() if x.rstrip().endswith(f"| {package}"))
    return int(line.split("|")[1]) / 1e6


def first_call_seconds(package: str, what: str) -> float:
    script = (
        f"import time\nimport numpy as np\nfrom {package} import Tensor\nrng = np.random.default_rng(0)\n"
        f"st = time.perf_counter()\n{FIRST_CALL[what]}print(time.perf_counter() - st)\n"
    )
    with tempfile.TemporaryDirectory() as cache:
        out = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, check=True, env=_env(XDG_CACHE_HOME=cache)
        )
    return float(out.stdout.split()[-1])


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DEV": "CPU", **extra}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # users' Python caches bytecode, as pip did for the installed peer
    return env


def main(runs: int = 5) -> None:
    measures = {"import": import_seconds, **{w: (lambda p, w=w: first_call_seconds(p, w)) for w in FIRST_CALL}}
    times: dict[tuple[str, str], list[float]] = {}
    failed: dict[str, str] = {}
    for package in PACKAGES:  # writes the bytecode caches, so every timed import reads them
        subprocess.run([sys.executable, "-c", f"import {package}"], capture_output=True, env=_env())
    for _ in range(runs):
        for name, measure in measures.items():
            for package in PACKAGES:
                try:
                    seconds = measure(package)
                    times.setdefault((name, package), []).append(seconds)
                except subprocess.CalledProcessError as e:  # e.g. tinygrad's CPU device needs clang, not gcc
                    failed.setdefault(package, e.stderr.strip().splitlines()[-1])
    print(f"{'':8} {'fusegrad s':>11} {'tinygrad s':>11} {'ratio':>7}   (medians of {runs} fresh processes)")
    for name in measures:
        ours, theirs = (statistics.median(times[(name, p)]) if (name, p) in times else None for p in PACKAGES)
        peer = f"{theirs:11.3f} {ours / theirs:6.2f}x" if ours and theirs else f"{'n/a':>11} {'n/a':>7}"
        print(f"{name:8} {ours if ours is not None else float('nan'):11.3f} {peer}")
    for package, why in failed.items():
        print(f"{package} failed: {why}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
