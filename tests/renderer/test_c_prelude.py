"""The C kernel's prelude: only the helpers it calls and declarations of the library functions it calls (the headers
only when it calls a function the declarations lack); several kernels in one translation unit."""

import ctypes

import numpy as np
import pytest

from fusegrad.renderer.c_prelude import HELPERS, c_prelude, c_unit
from fusegrad.runtime.ops_cpu import ClangCompiler

SQRT = "void k(float* out, const float* x) {\n  out[0] = sqrtf(x[0]) + (float)sqrt((double)x[1]);\n}\n"
FP8 = (
    "void k(float* out, const unsigned char* x) {\n  out[0] = fg_fp8_to_f32(x[0], 3, 7, 0, 0, 0x7F);\n"
    "  out[1] = fg_bf16_to_f32(0x3FC0);\n}\n"
)


@pytest.fixture(autouse=True)
def cold_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))


def ptr(a: np.ndarray) -> ctypes.c_void_p:
    return ctypes.c_void_p(a.ctypes.data)


def load(src: str) -> ctypes.CDLL:
    return ClangCompiler().load(src, "k")


def test_a_float_kernel_declares_what_it_calls_and_includes_no_header():
    head = c_prelude(SQRT)
    assert "#include" not in head and "float sqrtf(float);" in head and "double sqrt(double);" in head
    assert not any(h in head for h in HELPERS)
    out, x = np.zeros(1, np.float32), np.array([2.25, 6.25], np.float32)
    load(head + SQRT).k(ptr(out), ptr(x))
    assert out[0] == 4.0


def test_a_helper_comes_with_the_declarations_it_needs():
    head = c_prelude(FP8)
    assert "#include" not in head and "fg_fp8_to_f32" in head and "fg_bf16_to_f32" in head and "fg_expf" not in head
    assert "float copysignf(float, float);" in head and "#define NAN" in head and "#define INFINITY" in head
    out, x = np.zeros(2, np.float32), np.array([0x38], np.uint8)  # e4m3 0x38 is 1.0; bf16 0x3FC0 is 1.5
    load(head + FP8).k(ptr(out), ptr(x))
    np.testing.assert_array_equal(out, [1.0, 1.5])


def test_a_call_the_declarations_lack_includes_the_headers():
    kernel = "void k(float* out) {\n  out[0] = erff(out[0]);  /* sqrtf( in a comment is no call */\n}\n"
    head = c_prelude(kernel)
    assert head.startswith("#include <math.h>\n#include <string.h>\n") and "sqrtf" not in head
    out = np.ones(1, np.float32)
    load(head + kernel).k(ptr(out))
    np.testing.assert_allclose(out, [0.8427008], rtol=1e-6)


def test_kernels_in_one_unit_share_their_typedefs_and_helpers():
    vec = "typedef float fg_floatx4 __attribute__((vector_size(16)));\n"
    helper = "static inline fg_floatx4 twice(fg_floatx4 x) {\n  return x + x;\n}\n"
    a = vec + helper + "void a(float* o) {\n  fg_floatx4 v = {1, 2, 3, 4};\n  v = twice(v);\n  o[0] = v[3];\n}\n"
    b = vec + helper + "void b(float* o) {\n  o[0] = sqrtf(o[0]);\n}\n"
    unit = c_unit([("a", a), ("b", b)])
    assert unit.count("typedef") == 1 and unit.count("twice(fg_floatx4 x)") == 1
    lib = load(unit)
    out = np.array([9.0], np.float32)
    lib.a(ptr(out))
    assert out[0] == 8.0
    lib.b(ptr(out))
    assert out[0] == pytest.approx(8.0**0.5)


def test_a_kernel_text_of_another_shape_is_refused_by_name():
    with pytest.raises(ValueError, match="kernel b: its text has no function named b"):
        c_unit([("a", "void a(void) {\n}\n"), ("b", "void c(void) {\n}\n")])
    with pytest.raises(ValueError, match="kernel a: its text before the function"):
        c_unit([("a", "int g;\nvoid a(void) {\n}\n")])
