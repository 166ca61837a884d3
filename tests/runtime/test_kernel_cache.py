"""The CPU kernel cache repairs itself (bad binaries are rebuilt, never loaded) and falls back from an unwritable
directory; a compiler that hangs or writes nothing gives a clear error instead of a hang or a broken cache."""

import os
import stat
import subprocess
import sys
import numpy as np
import pytest
from fusegrad import Context, Tensor
from fusegrad.runtime import ops_cpu
from fusegrad.runtime.ops_cpu import ClangCompiler, CompileError

SRC = "int answer(void) { return 42; }\n"


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "fusegrad" / "cpu"


def count_compiler_runs(monkeypatch) -> list:
    calls: list = []
    real = ops_cpu.run_compiler

    def counting(argv, stdin, what):
        calls.append(what)
        return real(argv, stdin, what)

    monkeypatch.setattr(ops_cpu, "run_compiler", counting)
    return calls


def damage(path, how: str) -> None:
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write({"truncated": data[: len(data) // 2], "zero_bytes": b"", "garbage": os.urandom(len(data))}[how])


@pytest.mark.parametrize("how", ["truncated", "zero_bytes", "garbage"])
def test_damaged_cached_binary_is_rebuilt_not_loaded(cache_home, monkeypatch, how):
    compiler = ClangCompiler()
    path = compiler.compile(SRC, "answer")
    damage(path, how)
    calls = count_compiler_runs(monkeypatch)
    lib = compiler.load(SRC, "answer")
    assert lib.answer() == 42
    assert [c for c in calls if "compiling" in c] == ["compiling kernel answer"]
    # the rebuilt binary is trusted again: the next process-level lookup compiles nothing
    calls.clear()
    assert compiler.compile(SRC, "answer") == path and calls == []


def test_binary_that_fails_to_load_is_rebuilt_once(cache_home, monkeypatch):
    import hashlib

    compiler = ClangCompiler()
    path = compiler.compile(SRC, "answer")
    # matching checksum, but not a loadable library: dlopen fails, the file is deleted and compiled again
    garbage = b"not an ELF file" * 10
    open(path, "wb").write(garbage)
    open(path[: -len(".so")] + ".sha256", "w").write(hashlib.sha256(garbage).hexdigest())
    calls = count_compiler_runs(monkeypatch)
    assert compiler.load(SRC, "answer").answer() == 42
    assert len([c for c in calls if "compiling" in c]) == 1


def test_cache_without_checksums_is_rebuilt(cache_home, monkeypatch):
    # a binary from an older cache layout (no checksum beside it) is not trusted
    compiler = ClangCompiler()
    path = compiler.compile(SRC, "answer")
    os.unlink(path[: -len(".so")] + ".sha256")
    calls = count_compiler_runs(monkeypatch)
    assert compiler.load(SRC, "answer").answer() == 42 and len(calls) == 1


@pytest.mark.slow
def test_damaged_cache_end_to_end_in_fresh_processes(tmp_path):
    code = "from fusegrad import Tensor; print((Tensor([1.0, 2.0, 3.0]) * 7 + 1).tolist())"
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    run = lambda: subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)  # noqa: E731
    assert run().stdout.strip() == "[8.0, 15.0, 22.0]"
    for so in (tmp_path / "fusegrad" / "cpu").glob("*.so"):
        damage(so, "truncated")
    second = run()
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == "[8.0, 15.0, 22.0]"


def test_unwritable_cache_falls_back_to_a_temporary_directory_with_one_warning(tmp_path, monkeypatch):
    blocker = tmp_path / "not_a_directory"
    blocker.write_text("a file where the cache directory would go")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    compiler = ClangCompiler()
    with pytest.warns(UserWarning, match="not writable") as record:
        first = compiler.compile(SRC, "answer")
        second = compiler.compile(SRC.replace("42", "43"), "answer43")
    assert len(record) == 1
    assert os.path.dirname(first) == os.path.dirname(second) == compiler.cache.fallback
    assert compiler.load(SRC, "answer").answer() == 42


def test_unwritable_cache_end_to_end(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code = "from fusegrad import Tensor; print((Tensor([1.0, 2.0]) * 3 - 0.5).tolist())"
    out = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, "XDG_CACHE_HOME": str(blocker)}, capture_output=True, text=True
    )
    assert out.returncode == 0 and out.stdout.strip() == "[2.5, 5.5]"
    assert out.stderr.count("not writable") == 1


def fake_compiler(tmp_path, body: str) -> str:
    """A compiler script: answers --version, otherwise runs `body`."""
    script = tmp_path / "fake-cc"
    script.write_text(f'#!/bin/sh\nif [ "$1" = "--version" ]; then echo fake-cc 1.0; exit 0; fi\n{body}\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_compiler_that_writes_nothing_is_an_error_and_leaves_no_file(cache_home, tmp_path):
    cc = fake_compiler(tmp_path, "cat > /dev/null; exit 0")
    with Context(CC=cc), pytest.raises(CompileError, match="exited 0 on kernel E_13 but wrote no shared object") as e:
        (Tensor(np.arange(13, dtype=np.float32)) * 3).realize()
    assert cc in str(e.value)
    assert not cache_home.exists() or list(cache_home.iterdir()) == []


def test_compile_timeout_names_compiler_and_kernel_and_kills_it(cache_home, tmp_path):
    pid_file = tmp_path / "pid"
    cc = fake_compiler(tmp_path, f"sleep 60 & echo $! > {pid_file}; wait")
    x = Tensor(np.arange(11, dtype=np.float32))
    with Context(CC=cc, COMPILE_TIMEOUT=0.5), pytest.raises(CompileError) as e:
        (x - 2).realize()
    assert cc in str(e.value) and "kernel E_11" in str(e.value) and "COMPILE_TIMEOUT=0.5" in str(e.value)
    # the compiler's own children are killed with it, not left running
    pid = int(pid_file.read_text())
    state = open(f"/proc/{pid}/stat").read().split()[2] if os.path.exists(f"/proc/{pid}/stat") else "gone"
    assert state in ("gone", "Z")
    # the failed realize left the tensor usable: with the real compiler it computes
    np.testing.assert_array_equal((x - 2).numpy(), np.arange(11, dtype=np.float32) - 2)


def test_zero_compile_timeout_means_no_limit(cache_home, tmp_path):
    cc = fake_compiler(tmp_path, 'sleep 1; exec cc "$@"')
    with Context(CC=cc, COMPILE_TIMEOUT=0):
        assert ClangCompiler().load(SRC, "answer").answer() == 42


def test_bad_compile_timeout_is_named():
    out = subprocess.run(
        [sys.executable, "-c", "import fusegrad"],
        env={**os.environ, "COMPILE_TIMEOUT": "soon"},
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0 and "ValueError" in out.stderr and "COMPILE_TIMEOUT='soon'" in out.stderr
