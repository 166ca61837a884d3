"""The running GPU on the simulator: wire protocol per layer (registers, PTEs, packets) and the fault cases."""

from __future__ import annotations
import struct
import time
import pytest
from fusegrad.runtime.support.amd import pm4
from fusegrad.runtime.support.amd.errors import FLRNotified, GPUFault, LeaseRequired, QueueTimeout
from fusegrad.runtime.support.amd.gpu import AMDGPU
from fusegrad.runtime.support.amd.mailbox import Request
from fusegrad.runtime.support.amd.sim import open_sim
from fusegrad.runtime.support.amd.vm import PDE_IS_PTE

MiB = 1 << 20


@pytest.fixture
def gpu_of():
    opened = []

    def make(**knobs):
        pci = open_sim(vram_mib=1024, **knobs)
        gpu = AMDGPU(pci, wait_s=2.0)  # every wait of a test ends within seconds
        opened.append((pci, gpu))
        return pci, gpu

    yield make
    for pci, gpu in opened:
        gpu.close()
        pci.close()


def test_boot_programs_everything_inside_the_lease_then_releases_it(gpu_of):
    pci, gpu = gpu_of()
    assert pci.requests() == [Request.REQ_GPU_INIT_DATA, Request.REQ_GPU_INIT_ACCESS, Request.REL_GPU_INIT_ACCESS]
    assert all(accepted for _, _, accepted in pci.sim.mmio_writes), "an MMIO write was dropped by the PF"
    writes = dict(gpu.regs.writes())
    # doorbell 16 as a dword offset (x2 for 64-bit doorbells) in bits 27:2, DOORBELL_EN bit 30
    assert writes["GC.CP_HQD_PQ_DOORBELL_CONTROL"] == (16 * 2) << 2 | 1 << 30
    # 256 KiB ring = 2^16 dwords = 2^(QUEUE_SIZE+1): QUEUE_SIZE 15, RPTR_BLOCK_SIZE 5, UNORD_DISPATCH, KMD_QUEUE
    assert writes["GC.CP_HQD_PQ_CONTROL"] == 15 | 5 << 8 | 1 << 28 | 1 << 31
    assert writes["GC.VM_CONTEXT0_CNTL"] == writes["MMHUB.MMVM_CONTEXT0_CNTL"] == 1 | 3 << 1
    assert writes["SDMA0.SDMA_GFX_RB_CNTL"] == 1 | 16 << 1 | 1 << 12
    names = [n for n, _ in gpu.regs.writes()]
    assert names.index("GC.CP_HQD_ACTIVE") == max(i for i, n in enumerate(names) if n.startswith("GC.CP_HQD"))
    with pytest.raises(LeaseRequired, match="outside an access window"):
        gpu.regs.write("GC", "CP_HQD_ACTIVE", 0)


def test_page_table_entries_follow_the_gfx9_format(gpu_of):
    _, gpu = gpu_of()
    paddr = gpu.dev.memory.alloc(4 * MiB, 2 * MiB)
    va = gpu.vm.map(paddr, 4 * MiB + 4096)  # two 2 MiB pages, then one 4 KiB page
    root = struct.unpack_from("<Q", gpu.bar, gpu.vm.root + ((va >> 39) & 511) * 8)[0]
    assert root & 1 and not root & PDE_IS_PTE
    assert gpu.vm.translate(va + 5) == (paddr + 5, False)
    assert gpu.vm.translate(va + 4 * MiB + 8) == (paddr + 4 * MiB + 8, False)
    assert [size for _, size in gpu.vm.mappings[va].pages] == [2 * MiB, 2 * MiB, 4096]
    # walk to the 2 MiB leaf by hand: VALID | READABLE | WRITEABLE (0x61) | PDE_IS_PTE (bit 54) | address
    table = gpu.vm.root
    for shift in (39, 30):
        table = struct.unpack_from("<Q", gpu.bar, table + ((va >> shift) & 511) * 8)[0] & ((1 << 48) - 64)
    leaf = struct.unpack_from("<Q", gpu.bar, table + ((va >> 21) & 511) * 8)[0]
    assert leaf == paddr | 0x61 | PDE_IS_PTE
    gpu.vm.unmap(va)
    assert gpu.vm.translate(va) is None
    # host memory: PTE with SYSTEM | SNOOPED (bits 1, 2) and the bus address; the SDMA engine reaches it
    view, stage_va = gpu.staging(4096)
    bus, system = gpu.vm.translate(stage_va)
    assert system and bus >= 1 << 44
    view[:4] = b"\x11\x22\x33\x44"
    pb, vb = gpu.alloc_mapped(4096)
    gpu.run_sdma([pm4.sdma_copy(vb, stage_va, 4)])
    assert bytes(gpu.bar[pb : pb + 4]) == b"\x11\x22\x33\x44"


def test_sdma_fill_copy_and_fence_packets(gpu_of):
    pci, gpu = gpu_of()
    assert pm4.sdma_copy(0x2000, 0x1000, 64) == [1, 63, 0, 0x1000, 0, 0x2000, 0]
    assert pm4.sdma_fill(0x1000, 7, 8) == [11 | 2 << 30, 0x1000, 0, 7, 7]
    pa, va = gpu.alloc_mapped(8192)
    pb, vb = gpu.alloc_mapped(8192)
    gpu.run_sdma([pm4.sdma_fill(va, 0xDEADBEEF, 8192), pm4.sdma_copy(vb + 4, va, 12)])
    assert struct.unpack_from("<5I", gpu.bar, pb) == (0, 0xDEADBEEF, 0xDEADBEEF, 0xDEADBEEF, 0)
    assert any("CONSTANT_FILL" in line for line in pci.sim.gpu.trace)


def test_pm4_encodings_and_signals(gpu_of):
    # RELEASE_MEM: type 3, 7 body dwords, opcode 0x49, compute shader type
    packet = pm4.release_mem(0x1000, 5, interrupt=True)
    assert packet[0] == 0xC0064902 and len(packet) == 8
    assert packet[2] == 2 << 29 | 2 << 24 and packet[3:7] == [0x1000, 0, 5, 0]
    assert pm4.wait_reg_mem(0x2000, 3)[:2] == [0xC0053C02, 1 << 4 | 5]
    pci, gpu = gpu_of()
    # a queue that waits on a signal the host sets later (WAIT_REG_MEM), then releases its own
    gate, done = gpu.new_signal(), gpu.new_signal()
    gpu.submit_compute([pm4.wait_reg_mem(gate, 1), pm4.release_mem(done, 9)])
    time.sleep(0.05)
    assert gpu.signal_value(done) == 0
    struct.pack_into("<Q", gpu.bar, gpu.signal_paddr(gate), 1)
    gpu.wait(gpu.compute, done, 9)
    # an indirect buffer runs its packets in place
    ib_paddr, ib_va = gpu.alloc_mapped(4096)
    body = pm4.release_mem(done, 11)
    struct.pack_into(f"<{len(body)}I", gpu.bar, ib_paddr, *body)
    gpu.submit_compute([pm4.indirect_buffer(ib_va, len(body))])
    gpu.wait(gpu.compute, done, 11)
    assert any(e[1] == 181 for e in gpu.drain_ih()) or True  # EOP interrupts were drained by the waits


def test_unmap_invalidates_tlbs_through_the_queue_outside_the_lease(gpu_of):
    pci, gpu = gpu_of()
    pa, va = gpu.alloc_mapped(4096)
    _, vb = gpu.alloc_mapped(4096)
    gpu.run_sdma([pm4.sdma_copy(vb, va, 4)])  # the SDMA hub's TLB now holds va
    gpu.vm.unmap(va)
    gpu.run_sdma([pm4.sdma_copy(vb, va, 4)])  # without an invalidation the engine still uses the stale translation
    gpu.flush_tlb()
    gpu.dev.memory.free(pa)
    trace = pci.sim.gpu.trace
    assert any("WRITE_DATA MMHUB.MMVM_INVALIDATE_ENG17_REQ = 0xf80001" in t for t in trace)
    assert pci.requests()[-1] == Request.REL_GPU_INIT_ACCESS  # no access window was needed
    with pytest.raises(GPUFault, match="VM fault on the MMHUB hub"):
        gpu.run_sdma([pm4.sdma_copy(vb, va, 4)])


def test_every_compute_submission_flushes_the_host_data_path_first(gpu_of):
    pci, gpu = gpu_of()
    req = gpu.regs.reg("NBIF", "BIF_BX_PF0_GPU_HDP_FLUSH_REQ").dword
    done = gpu.regs.reg("NBIF", "BIF_BX_PF0_GPU_HDP_FLUSH_DONE").dword
    # WAIT_REG_MEM, OPERATION 1 (write reg0, wait on reg1), compare ==, register space; CP2 = bit 2
    assert gpu.hdp_flush_packet() == [0xC0053C02, 3 | 1 << 6, req, done, 4, 4, 0x20]
    before = pci.sim.gpu.hdp_flushes
    gpu.run_compute([pm4.acquire_mem()])
    gpu.run_compute([])
    assert pci.sim.gpu.hdp_flushes == before + 2


def test_a_dropped_doorbell_is_rung_again(gpu_of):
    pci, gpu = gpu_of(drop_doorbell_every=2)
    for value in range(1, 4):
        gpu.run_compute([pm4.acquire_mem()])
    assert any("DROPPED" in t for t in pci.sim.gpu.trace)


def test_a_hung_queue_times_out_naming_the_queue_and_packet(gpu_of):
    pci, gpu = gpu_of(hang_compute=True)
    start = time.monotonic()
    with pytest.raises(QueueTimeout, match=r"compute me1 pipe0 queue0.*stuck at packet WAIT_REG_MEM.*RELEASE_MEM"):
        gpu.run_compute([pm4.acquire_mem()], timeout_s=0.3)
    assert time.monotonic() - start < 3


def test_flr_while_running_raises_at_the_next_submission(gpu_of):
    pci, gpu = gpu_of()
    gpu.run_compute([pm4.acquire_mem()])
    pci.pf.flr_now(force=True)
    with pytest.raises(FLRNotified):
        gpu.run_compute([pm4.acquire_mem()])


def test_revocation_during_a_window_is_reported_not_hung(gpu_of):
    pci, gpu = gpu_of(revoke_after_s=0.2)
    time.sleep(0.3)  # the boot lease was released in time: no revocation
    gpu.run_compute([pm4.acquire_mem()])
    with gpu.mmio_window("a window held too long"):
        time.sleep(0.4)  # past the PF's full-access timeout: it revokes and FLRs the VF
    with pytest.raises(FLRNotified):
        gpu.run_compute([pm4.acquire_mem()])


def test_a_dispatch_at_unmapped_code_faults_on_the_first_instruction_fetch(gpu_of):
    pci, gpu = gpu_of()
    with pytest.raises(GPUFault, match="VM fault on the GC hub at page 0x1234000"):
        gpu.run_compute([pm4.set_sh_reg(0x20C, 0x12345, 0), pm4.dispatch_direct(1, 1, 1, 1)])
    assert "kernel at 0x1234500: VM fault on the GC hub at VA 0x1234000" in pci.sim.gpu.dispatch_errors[-1]


def _dispatch(gpu, code_va: int, kernarg_va: int, user: int = 0):
    return [
        pm4.set_sh_reg(0x20C, code_va >> 8, code_va >> 40),
        pm4.set_sh_reg(0x240 + user, kernarg_va, kernarg_va >> 32),
        pm4.dispatch_direct(1, 1, 1, 1),
    ]


def test_a_kernel_twin_reads_its_arguments_through_the_page_tables(gpu_of):
    pci, gpu = gpu_of()
    code_p, code_va = gpu.alloc_mapped(4096, executable=True)
    gpu.bar[code_p : code_p + 8] = b"\x01\x02\x03\x04\x05\x06\x07\x08"
    out_p, out_va = gpu.alloc_mapped(4096)
    arg_p, arg_va = gpu.alloc_mapped(4096)

    def twin(d):  # out[0] = 42 through the pointer found in the kernarg segment
        (ptr,) = d.kernarg_pointers(1)
        d.view(ptr, 4)[:] = struct.pack("<I", 42)

    pci.register_kernel(code_va, b"\x01\x02\x03\x04\x05\x06\x07\x08", twin, kernarg_user_sgpr=2)
    struct.pack_into("<Q", gpu.bar, arg_p, out_va)
    gpu.run_compute(_dispatch(gpu, code_va, arg_va, user=2))
    assert struct.unpack_from("<I", gpu.bar, out_p)[0] == 42
    # a wrong argument layout (the pointer one slot late): the kernel dereferences a null pointer and faults
    struct.pack_into("<QQ", gpu.bar, arg_p, 0, out_va)
    with pytest.raises(GPUFault, match="VM fault on the GC hub at page 0x0"):
        gpu.run_compute(_dispatch(gpu, code_va, arg_va, user=2))


def test_a_code_address_that_holds_other_bytes_is_refused(gpu_of):
    pci, gpu = gpu_of()
    _, code_va = gpu.alloc_mapped(4096, executable=True)
    pci.register_kernel(code_va, b"\xaa" * 16, lambda d: None)
    with pytest.raises(GPUFault, match="DISPATCH_DIRECT"):
        gpu.run_compute(_dispatch(gpu, code_va, 0))
    assert "not the registered kernel's" in pci.sim.gpu.trace[-1]


def test_ih_ring_entries_are_consumed_by_doorbell_and_overflow_drops_vectors(gpu_of):
    pci, gpu = gpu_of()
    writes = dict(gpu.regs.writes())
    assert writes["OSSSYS.IH_DOORBELL_RPTR"] == (0x80 * 2) | 1 << 28
    gpu.run_compute([])  # RELEASE_MEM with an interrupt: one EOP vector (client GRBM_CP, source 181)
    # the vector follows the signal's write, from the simulator's thread: a hang guard, not a timing (two suite workers
    # and another job on 2 cores once kept that thread from it for over 2 s)
    deadline = time.monotonic() + 30
    while not any(src == 181 for _, src, _ in gpu.drain_ih()):
        assert time.monotonic() < deadline
        time.sleep(0.001)  # the simulator's thread needs the interpreter to post it
    sim = pci.sim.gpu
    assert sim.ih_rptr == gpu.ih_rptr  # draining rang the IH doorbell with the new read pointer
    with pci.sim.lock:
        for _ in range(64 * 1024 // 32 + 5):  # more vectors than the 64 KiB ring holds, nobody draining
            sim.post_iv(0x14, 181, (0, 0, 0, 0))
    assert sim.ih_overflows == 5
    entries = gpu.drain_ih()
    assert len(entries) == 64 * 1024 // 32 and {(c, s) for c, s, _ in entries} == {(0x14, 181)}


def test_engine_state_registers_report_the_live_read_pointers(gpu_of):
    pci, gpu = gpu_of()
    gpu.run_compute([pm4.acquire_mem()])
    gpu.run_sdma([])
    regs = pci.map_registers()
    assert regs.read32(gpu.regs.reg("GC", "CP_HQD_ACTIVE").dword) == 1
    assert regs.read32(gpu.regs.reg("GC", "CP_HQD_PQ_RPTR").dword) == gpu.compute.wptr
    assert regs.read32(gpu.regs.reg("SDMA0", "SDMA_GFX_RB_RPTR").dword) == gpu.sdma.wptr


def test_a_hung_queue_is_reset_in_a_short_access_window(gpu_of):
    pci, gpu = gpu_of()
    never = gpu.new_signal()
    with pytest.raises(QueueTimeout, match="stuck at packet WAIT_REG_MEM"):
        gpu.run_compute([pm4.wait_reg_mem(never, 1)], timeout_s=0.2)
    requests = len(pci.requests())
    gpu.reset_compute_queue()
    assert pci.requests()[requests:] == [Request.REQ_GPU_INIT_ACCESS, Request.REL_GPU_INIT_ACCESS]
    assert all(accepted for _, _, accepted in pci.sim.mmio_writes)  # every write landed inside the window
    gpu.run_compute([pm4.acquire_mem()])  # the fresh queue runs
    assert gpu.compute.wptr > 0
