"""Small files with one job: no source file of the package, its benchmarks or its examples is over 700 lines (a
file that grows past it gets split where it holds more than one job)."""

from __future__ import annotations

import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
MAX_LINES = 700


def test_no_source_file_is_over_700_lines():
    sizes = {
        str(p.relative_to(ROOT)): len(p.read_text().splitlines())
        for folder in ("fusegrad", "bench", "examples")
        for p in (ROOT / folder).rglob("*.py")
    }
    assert len(sizes) > 100, sorted(sizes)
    assert {path: n for path, n in sizes.items() if n > MAX_LINES} == {}
