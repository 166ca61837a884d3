"""The boot plan as data: what a VF runs, what it skips and why, and that nothing it runs is PF-owned."""

from __future__ import annotations

import pytest

from fusegrad.runtime.support.amd.bootplan import PF_OWNED, STEP_NAMES, STEPS, plan_boot

# Facts sheet §6: PSP and SMU bring-up, partial-boot detection, clock/power programming, clock gating, scratch-register
# state writes, spatial-partition commands and ACA bank reads.
VF_SKIPS = {
    "init_sw.psp",
    "init_sw.smu",
    "init_hw.psp",
    "init_hw.smu",
    "psp.mode1_reset",
    "pci.bus_master_clear",
    "xgmi.hive_check",
    "partial_boot_detect",
    "smu.power_limit",
    "smu.set_clocks",
    "smu.clocks_level0",
    "clock_gating.soc",
    "clock_gating.gfx",
    "scratch.write_version",
    "scratch.write_state",
    "scratch.write_state_fini",
    "gfx.spatial_partition",
    "ih.read_aca_banks",
}


@pytest.mark.parametrize("xccs", [1, 8])
def test_vf_plan_touches_nothing_the_pf_owns(xccs):
    plan = plan_boot(is_vf=True, xccs=xccs)
    assert not plan.touched & PF_OWNED
    assert {step.name for step, _ in plan.skipped} == VF_SKIPS
    assert all(why for _, why in plan.skipped)
    assert set(plan.names()) | VF_SKIPS == STEP_NAMES


def test_vf_plan_order():
    plan = plan_boot(is_vf=True)
    assert plan.names("boot")[:7] == [
        "map_bars",
        "detect_vf",
        "vf.request_init_data",
        "vf.request_init_access",
        "read_vram_size",
        "discovery",
        "memory",
    ]
    assert "pci.bus_master_set" in plan.names("boot")  # a VF still sets bus mastering
    assert plan.names("fini")[-1] == "vf.release_init_access"
    assert plan.names("runtime") == []


def test_pf_plan_runs_the_pf_owned_steps_and_no_mailbox():
    plan = plan_boot(is_vf=False, xccs=8)
    assert VF_SKIPS <= set(plan.names())
    assert not any(name.startswith("vf.") for name in plan.names())
    assert "gfx.spatial_partition" not in plan_boot(is_vf=False, xccs=1).names()
    assert plan.touched >= PF_OWNED


def test_plan_is_printable_and_validated():
    text = str(plan_boot(is_vf=True))
    assert "skip  boot    init_hw.psp: the PF owns it" in text and "run   boot    discovery" in text
    with pytest.raises(ValueError, match="xccs"):
        plan_boot(is_vf=True, xccs=0)
    with pytest.raises(ValueError, match="phase"):
        plan_boot(is_vf=True).phase("later")


def test_step_names_are_unique():
    assert len(STEP_NAMES) == len(STEPS)
