"""fusegrad-amd list / probe, through main(argv) and once through `python -m`."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from amd_testlib import add_bar_files, make_function

from fusegrad.runtime.support.amd import cli

REPO = Path(__file__).resolve().parents[2]


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return cli.main(list(argv), out=out), out.getvalue()


@pytest.fixture
def sysfs(tmp_path):
    root = tmp_path / "bus" / "pci" / "devices"
    root.mkdir(parents=True)
    make_function(root, "0000:83:00.0", 0x1002, 0x75B0)
    make_function(root, "0000:84:00.0", 0x1002, 0x75B0, driver="amdgpu")
    make_function(root, "0000:85:00.0", 0x1002, 0x75A0)
    make_function(root, "0000:00:02.0", 0x8086, 0x1234, class_code=0x030000)
    return root


@pytest.fixture
def as_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)


def test_list_on_this_host_exits_zero():
    code, out = run("list")
    assert code == 0 and out.strip()


def test_list_without_amd_gpus_says_so(tmp_path):
    code, out = run("list", "--sysfs-root", str(tmp_path))
    assert code == 0
    assert out == f"No AMD GPU found: no AMD display or accelerator function under {tmp_path}.\n"


def test_list_fake_sysfs(sysfs):
    code, out = run("list", "--sysfs-root", str(sysfs))
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == ["ADDRESS", "IDS", "SUBSYSTEM", "KIND", "DRIVER", "NAME"]
    assert lines[1].split() == ["0000:83:00.0", "1002:75b0", "1002:75a0", "VF", "-", "Instinct", "MI350X", "VF"]
    assert lines[2].split()[3:5] == ["VF", "amdgpu"]
    assert lines[3].split()[3:5] == ["PF", "-"]
    assert "8086" not in out


def test_list_sim():
    code, out = run("list", "--sim")
    assert code == 0 and "0000:83:00.0" in out and "(simulated)" in out


def test_probe_sim_prints_ip_versions_and_vram():
    code, out = run("probe", "--sim", "0000:83:00.0", "--plan")
    assert code == 0
    assert "function: VF" in out and "lease: acquired" in out
    assert "VRAM: 32768 MiB" in out and "paddr_base 0x100000" in out
    assert "GC       hw_id  11  instance 0  version 9.5.0" in out
    assert "skip  boot    init_hw.psp" in out
    assert out.rstrip().endswith("lease: released (REL_GPU_INIT_ACCESS sent)")


def test_probe_refuses_a_bound_function(sysfs, as_root, capsys):
    code, _ = run("probe", "84:00.0", "--sysfs-root", str(sysfs))
    err = capsys.readouterr().err
    assert code == 2 and "bound to kernel driver 'amdgpu'" in err and "--force" in err


def test_probe_refuses_without_root(sysfs, monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    code, _ = run("probe", "83:00.0", "--sysfs-root", str(sysfs))
    err = capsys.readouterr().err
    assert code == 2 and "needs root" in err and "uid 1000" in err


def test_probe_refuses_non_amd_and_bad_addresses(sysfs, as_root, capsys):
    assert run("probe", "00:02.0", "--sysfs-root", str(sysfs))[0] == 2
    assert "not an AMD function" in capsys.readouterr().err
    assert run("probe", "gpu0", "--sysfs-root", str(sysfs))[0] == 2
    assert "not a PCI address" in capsys.readouterr().err
    assert run("probe", "--sysfs-root", str(sysfs))[0] == 2
    assert "needs a PCI ADDRESS" in capsys.readouterr().err


def test_probe_reports_device_errors(sysfs, as_root, capsys):
    code, _ = run("probe", "99:00.0", "--sysfs-root", str(sysfs))
    assert code == 1 and "no PCI function 0000:99:00.0" in capsys.readouterr().err


def test_probe_real_path_on_plain_files(sysfs, as_root):
    add_bar_files(sysfs / "0000:85:00.0", vram_mib=1024)
    code, out = run("probe", "85:00.0", "--sysfs-root", str(sysfs))
    assert code == 0 and "function: PF" in out and "VRAM: 1024 MiB" in out and "9.5.0" in out
    assert "lease" not in out


def test_force_overrides_the_driver_and_root_checks(sysfs, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    add_bar_files(sysfs / "0000:84:00.0", vram_mib=1024)
    code, out = run("probe", "84:00.0", "--sysfs-root", str(sysfs), "--force")
    assert code == 0 and "VRAM: 1024 MiB" in out


def test_python_dash_m_entry_point(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "fusegrad.runtime.support.amd.cli", "list", "--sysfs-root", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0 and result.stdout.startswith("No AMD GPU found"), result.stderr


def test_run_sim_prints_the_boot_registers_and_the_ring_traffic():
    code, text = run("run", "--sim")
    assert code == 0, text
    assert "W GC.CP_HQD_ACTIVE" in text and "lease: released after boot" in text
    assert "SDMA fill + copy: (1.0, 1.0, 1.0, 1.0)" in text
    assert "sdma0 gfx: COPY_LINEAR" in text and "compute me1 pipe0 queue0: RELEASE_MEM" in text
    assert "WRITE_DATA GC.VM_INVALIDATE_ENG17_REQ" in text  # the unmap's TLB flush went through the queue
    assert text.rstrip().endswith("mailbox requests: 6 1 2 1 2")
