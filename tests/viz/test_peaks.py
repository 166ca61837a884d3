"""The roofline's roof: the host's peaks are measured once, kept on disk per machine, and measured again when the
kept file is damaged."""

import json
import os

import pytest

from fusegrad.viz import peaks


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path


def test_peaks_are_measured_once_and_kept(empty_cache, monkeypatch):
    monkeypatch.setattr(peaks, "MATMUL_N", 256)  # the measurement's method, at a size a test affords
    monkeypatch.setattr(peaks, "COPY_BYTES", 1 << 24)
    first = peaks.machine_peaks()
    assert first["GFLOPS"] > 0.1 and first["GB/s"] > 0.1 and "256x256 matmul" in first["how"]

    def measuring_again():
        raise AssertionError("measured again although the peaks are on disk")

    monkeypatch.setattr(peaks, "measure_peaks", measuring_again)
    assert peaks.machine_peaks() == first


def test_a_damaged_peaks_file_is_measured_again(empty_cache, monkeypatch):
    fixed = {"GFLOPS": 12.5, "GB/s": 3.25, "how": "stub"}
    monkeypatch.setattr(peaks, "measure_peaks", lambda: dict(fixed))
    path = os.path.join(str(empty_cache), "fusegrad", "viz", f"peaks-{peaks._machine_key()}.json")
    os.makedirs(os.path.dirname(path))
    for damaged in ("{not json", json.dumps([1, 2]), json.dumps({"GFLOPS": "fast"})):
        with open(path, "w") as f:
            f.write(damaged)
        assert peaks.machine_peaks() == fixed
        with open(path) as f:
            assert json.load(f) == fixed  # the measurement replaced the damaged file
