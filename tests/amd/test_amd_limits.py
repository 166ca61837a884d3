"""Every time, attempt and latency parameter of the AMD layer and its CLI refuses NaN, infinities, bools and bad ranges.

A NaN deadline never passes (every comparison with it is false), so before these checks it made each wait loop forever.
"""

from __future__ import annotations

import io
import math
import re
import time

import pytest
from amd_testlib import QUICK, ROOMY, SLACK_S

from fusegrad.runtime.support.amd import cli
from fusegrad.runtime.support.amd.device import AMDDevice
from fusegrad.runtime.support.amd.limits import MAX_ATTEMPTS, MAX_WAIT_S
from fusegrad.runtime.support.amd.mailbox import Event, Mailbox, MailboxTimeouts, Request
from fusegrad.runtime.support.amd.sim import SimConfig, open_sim

TIMEOUT_FIELDS = ["ack_clear_s", "ack_s", "event_s", "ack_clear_poll_s", "ack_poll_s", "event_poll_s"]
NOT_FINITE_OR_NOT_POSITIVE = [
    math.nan,
    -math.nan,
    math.inf,
    -math.inf,
    0,
    0.0,
    -0.0,
    -1,
    -1e-9,
    MAX_WAIT_S * 2,
    1e300,
    10**400,
]


@pytest.mark.parametrize("name", TIMEOUT_FIELDS)
@pytest.mark.parametrize("value", NOT_FINITE_OR_NOT_POSITIVE, ids=repr)
def test_mailbox_timeouts_reject_non_finite_non_positive_and_huge(name, value):
    with pytest.raises(ValueError, match=rf"MailboxTimeouts\.{name} .*got {re.escape(repr(value))}"):
        MailboxTimeouts(**{name: value})


@pytest.mark.parametrize("name", [*TIMEOUT_FIELDS, "retries"])
@pytest.mark.parametrize("value", [True, False, "1", None, 1j], ids=repr)
def test_mailbox_timeouts_reject_bools_and_non_numbers(name, value):
    with pytest.raises(TypeError, match=rf"MailboxTimeouts\.{name} .*{re.escape(repr(value))}"):
        MailboxTimeouts(**{name: value})


@pytest.mark.parametrize("value", [0, -1, MAX_ATTEMPTS + 1, 10**18])
def test_mailbox_timeouts_reject_attempt_counts_out_of_range(value):
    with pytest.raises(ValueError, match=rf"MailboxTimeouts\.retries .*got {value}"):
        MailboxTimeouts(retries=value)


@pytest.mark.parametrize("value", [math.nan, math.inf, 1.5, 2.0])
def test_mailbox_timeouts_reject_non_integer_retries(value):
    with pytest.raises(TypeError, match=r"MailboxTimeouts\.retries"):
        MailboxTimeouts(retries=value)


def test_valid_limits_are_accepted_and_kept():
    t = MailboxTimeouts(ack_clear_s=MAX_WAIT_S, ack_s=1, event_s=0.25, retries=MAX_ATTEMPTS)
    assert (t.ack_clear_s, t.ack_s, t.event_s, t.retries) == (MAX_WAIT_S, 1, 0.25, MAX_ATTEMPTS)


@pytest.mark.parametrize("retries", [0, -3, math.nan, True, 1.5, MAX_ATTEMPTS + 1])
def test_request_retries_override_is_checked_before_touching_the_mailbox(retries):
    with open_sim() as pci:
        mailbox = Mailbox(pci.map_registers(), QUICK)
        with pytest.raises((ValueError, TypeError), match="retries"):
            mailbox.request(Request.REQ_GPU_INIT_DATA, Event.REQ_GPU_INIT_DATA_READY, retries=retries)
        assert pci.requests() == []


def test_mailbox_refuses_something_that_is_not_mailbox_timeouts():
    with open_sim() as pci, pytest.raises(TypeError, match="MailboxTimeouts"):
        Mailbox(pci.map_registers(), {"event_s": 1.0})


@pytest.mark.parametrize("xccs", [0, -1, math.nan, True, 2.0, 10**6])
def test_device_xccs_is_checked_before_touching_the_device(xccs):
    with open_sim() as pci:
        with pytest.raises((ValueError, TypeError), match="xccs"):
            AMDDevice(pci, ROOMY, xccs=xccs)
        assert pci.requests() == [] and pci.sim.mmio_writes == []


SIM_SECONDS = ["ack_latency_s", "event_latency_s", "flr_duration_s", "busy_pf_s"]
SIM_OPTIONAL_SECONDS = ["revoke_after_s", "flr_after_s", "late_grant_s"]


@pytest.mark.parametrize("name", SIM_SECONDS + SIM_OPTIONAL_SECONDS)
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, -0.5, MAX_WAIT_S * 2], ids=repr)
def test_sim_latencies_reject_non_finite_negative_and_huge(name, value):
    with pytest.raises(ValueError, match=rf"SimConfig\.{name} .*got {re.escape(repr(value))}"):
        SimConfig(**{name: value})


@pytest.mark.parametrize("name", SIM_SECONDS + SIM_OPTIONAL_SECONDS)
def test_sim_latencies_reject_bools(name):
    with pytest.raises(TypeError, match=rf"SimConfig\.{name}"):
        SimConfig(**{name: True})


@pytest.mark.parametrize(
    ("knobs", "error"),
    [
        ({"vram_mib": math.nan}, TypeError),
        ({"vram_mib": True}, TypeError),
        ({"vram_mib": 1 << 32}, ValueError),
        ({"bar0_mib": 0.5}, TypeError),
        ({"guard_drop_every": True}, TypeError),
        ({"guard_drop_every": 0}, ValueError),
        ({"crit_region_version": True}, TypeError),
        ({"wrong_event": -1}, ValueError),
        ({"stale_event": 1 << 32}, ValueError),
        ({"wrong_event": math.nan}, TypeError),
    ],
    ids=str,
)
def test_sim_counts_and_ids_are_checked(knobs, error):
    with pytest.raises(error, match=next(iter(knobs))):
        SimConfig(**knobs)


def test_zero_latencies_are_a_valid_instant_pf():
    with open_sim(ack_latency_s=0, event_latency_s=0, busy_pf_s=0, flr_duration_s=0) as pci:
        with AMDDevice(pci, ROOMY) as dev:
            assert dev.lease.acquired


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "0", "-1", "1e9", "soon"])
def test_cli_event_timeout_is_refused_before_anything_runs(value, capsys):
    start = time.monotonic()
    with pytest.raises(SystemExit) as info:
        cli.main(["probe", "--sim", f"--event-timeout={value}"])
    assert info.value.code == cli.EXIT_REFUSED
    assert time.monotonic() - start < SLACK_S
    err = capsys.readouterr().err
    assert "--event-timeout" in err and value in err


def test_cli_event_timeout_accepts_a_plain_number():
    code = cli.main(["probe", "--sim", "--event-timeout", "1.5"], out=io.StringIO())
    assert code == cli.EXIT_OK
