"""The boot plan: every step of a device bring-up, what each touches, and which ones a VF takes (facts sheet §6).

One table instead of `if is_vf` scattered through code, so a test can assert what a VF does and does not touch.
"""

from __future__ import annotations

from dataclasses import dataclass

from .limits import check_count

# Resources a VF must leave alone: the PF owns PSP and SMU firmware, scratch-register state, clock gating, the XGMI
# hive, and the ACA error banks (read through the SMU).
PF_OWNED = frozenset({"PSP", "SMU", "SCRATCH", "CLOCK_GATING", "XGMI_HIVE", "ACA"})
PHASES = ("boot", "runtime", "fini")
PF_ONLY = "the PF owns it"
# MI300X and MI350X have 8 XCDs, the most of any part this layer knows.
MAX_XCCS = 8


@dataclass(frozen=True)
class BootStep:
    """One step. `layer` is "driver" (run by AMDDevice) or "ip" (run by an IP-block handler a higher layer provides)."""

    name: str
    phase: str
    touches: frozenset[str]
    layer: str = "ip"
    on_vf: bool = True
    on_pf: bool = True
    condition: str = ""  # checked at run time by whoever runs the step
    vf_skip_reason: str = ""


def _step(
    name: str,
    phase: str,
    touches: str,
    layer: str = "ip",
    on_vf: bool = True,
    on_pf: bool = True,
    condition: str = "",
    why: str = "",
) -> BootStep:
    return BootStep(
        name, phase, frozenset(touches.split()), layer, on_vf, on_pf, condition, why or ("" if on_vf else PF_ONLY)
    )


_ALIVE = "PSP and SMU are alive"
STEPS: tuple[BootStep, ...] = (
    _step("map_bars", "boot", "PCI_BARS", "driver"),
    _step("detect_vf", "boot", "NBIO_REGS", "driver"),
    _step("vf.request_init_data", "boot", "MAILBOX", "driver", on_pf=False),
    _step("vf.request_init_access", "boot", "MAILBOX", "driver", on_pf=False),
    _step("read_vram_size", "boot", "NBIO_REGS", "driver"),
    _step("discovery", "boot", "VRAM", "driver"),
    _step("memory", "boot", "ALLOCATOR", "driver"),
    _step(
        "partial_boot_detect",
        "boot",
        "SCRATCH",
        on_vf=False,
        why="a VF always does a full boot; the PF owns the scratch registers it would read",
    ),
    *(_step(f"init_sw.{ip}", "boot", ip.upper()) for ip in ("soc", "gmc", "ih")),
    _step("init_sw.psp", "boot", "PSP", on_vf=False, why="the PF owns PSP; its buffers would be unused boot memory"),
    _step("init_sw.smu", "boot", "SMU", on_vf=False, why="the PF owns SMU; its driver table would be unused"),
    *(_step(f"init_sw.{ip}", "boot", ip.upper()) for ip in ("gfx", "sdma")),
    _step(
        "pci.bus_master_clear",
        "boot",
        "PCI_CONFIG",
        on_vf=False,
        condition=_ALIVE,
        why="only precedes a mode-1 reset, which a VF never does",
    ),
    _step("xgmi.hive_check", "boot", "XGMI_HIVE", on_vf=False, condition=_ALIVE),
    _step("psp.mode1_reset", "boot", "PSP SMU", on_vf=False, condition=_ALIVE, why="a VF never requests a GPU reset"),
    _step("pci.bus_master_set", "boot", "PCI_CONFIG", "driver"),
    *(_step(f"init_hw.{ip}", "boot", ip.upper()) for ip in ("soc", "gmc", "ih")),
    _step("init_hw.psp", "boot", "PSP", on_vf=False),
    _step("init_hw.smu", "boot", "SMU", on_vf=False),
    _step("init_hw.gfx", "boot", "GFX"),
    _step(
        "gfx.spatial_partition",
        "boot",
        "PSP",
        on_vf=False,
        condition="more than one XCC",
        why="the VF keeps the partition the PF assigned",
    ),
    _step("init_hw.sdma", "boot", "SDMA"),
    _step("smu.power_limit", "boot", "SMU", on_vf=False),
    _step("smu.set_clocks", "boot", "SMU", on_vf=False),
    _step("clock_gating.soc", "boot", "CLOCK_GATING", on_vf=False),
    _step("clock_gating.gfx", "boot", "CLOCK_GATING", on_vf=False),
    _step("scratch.write_version", "boot", "SCRATCH", on_vf=False),
    _step("scratch.write_state", "boot", "SCRATCH", on_vf=False),
    _step("ih.read_aca_banks", "runtime", "ACA SMU", on_vf=False, why="a VF's ACA bank list is empty"),
    _step("fini_hw.sdma", "fini", "SDMA"),
    _step("fini_hw.gfx", "fini", "GFX"),
    _step("smu.clocks_level0", "fini", "SMU", on_vf=False),
    _step("ih.interrupt_handler", "fini", "IH"),
    _step("scratch.write_state_fini", "fini", "SCRATCH", on_vf=False),
    _step("vf.release_init_access", "fini", "MAILBOX", "driver", on_pf=False),
)
STEPS_BY_NAME = {s.name: s for s in STEPS}
STEP_NAMES = frozenset(STEPS_BY_NAME)
IP_STEP_NAMES = frozenset(s.name for s in STEPS if s.layer == "ip")


@dataclass(frozen=True)
class BootPlan:
    """The steps a function takes, in order, and the steps it skips with the reason."""

    is_vf: bool
    steps: tuple[BootStep, ...]
    skipped: tuple[tuple[BootStep, str], ...]

    def names(self, phase: str | None = None) -> list[str]:
        return [s.name for s in self.steps if phase is None or s.phase == phase]

    def phase(self, phase: str) -> tuple[BootStep, ...]:
        if phase not in PHASES:
            raise ValueError(f"unknown boot phase {phase!r}; phases are {PHASES}")
        return tuple(s for s in self.steps if s.phase == phase)

    @property
    def touched(self) -> frozenset[str]:
        return frozenset().union(*(s.touches for s in self.steps))

    def __str__(self) -> str:
        lines = [f"boot plan ({'VF' if self.is_vf else 'PF'}): {len(self.steps)} steps, {len(self.skipped)} skipped"]
        lines += [
            f"  run   {s.phase:<7} {s.name}" + (f"  (if {s.condition})" if s.condition else "") for s in self.steps
        ]
        lines += [f"  skip  {s.phase:<7} {s.name}: {why}" for s, why in self.skipped]
        return "\n".join(lines)


def plan_boot(is_vf: bool, xccs: int = 1) -> BootPlan:
    """The plan for a VF or a PF with `xccs` compute dies."""
    check_count("xccs", xccs, maximum=MAX_XCCS)
    steps, skipped = [], []
    for step in STEPS:
        if is_vf and not step.on_vf:
            skipped.append((step, step.vf_skip_reason))
        elif not is_vf and not step.on_pf:
            skipped.append((step, "VF only"))
        elif step.name == "gfx.spatial_partition" and xccs == 1:
            skipped.append((step, "a single XCC has no partition to set"))
        else:
            steps.append(step)
    return BootPlan(is_vf, tuple(steps), tuple(skipped))
