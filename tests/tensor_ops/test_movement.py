"""Movement ops (docs/api.md: shape & layout, combine, tile & window) against torch: values, dtypes, shapes,
gradients.

Movement only moves data, so forward values must match exactly. Gradients go through `(out * w).sum().gradient(...)`
with a random weight `w`, so a gradient routed to the wrong element is caught, not just a wrong count.
"""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fusegrad import GlobalCounters, Tensor
from reference import TORCH2FG

GRAD_ATOL, GRAD_RTOL = 1e-5, 1e-4


def rand(*shape, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed + sum(shape))
    if dtype == np.bool_:
        return rng.random(shape) > 0.5
    if np.issubdtype(dtype, np.integer):
        return rng.integers(-100 if np.issubdtype(dtype, np.signedinteger) else 0, 100, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _negstep(t):
    return t[::-2] if t.ndim == 1 else t[::-1, ..., ::-2]


def _negstep_torch(t):  # torch has no negative steps: flip, then step
    return t.flip(0)[::2] if t.ndim == 1 else t.flip(0).flip(-1)[..., ::2]


# the same view applied to a fusegrad tensor and a torch tensor: non-contiguous and negative-step inputs
VIEWS = {
    "contiguous": (lambda t: t, lambda t: t),
    "permuted": (lambda t: t.permute(*reversed(range(t.ndim))), lambda t: t.permute(*reversed(range(t.ndim)))),
    "sliced": (lambda t: t[1:, ..., ::2], lambda t: t[1:, ..., ::2]),
    "negstep": (_negstep, _negstep_torch),
}


def check(out, ref):
    """out (Tensor) equals ref (torch tensor) exactly, with the same dtype and shape."""
    assert isinstance(out, Tensor), f"expected a Tensor, got {type(out).__name__}"
    assert out.dtype == TORCH2FG[ref.dtype], f"dtype {out.dtype} != torch {ref.dtype}"
    assert out.shape == tuple(ref.shape), f"shape {out.shape} != torch {tuple(ref.shape)}"
    np.testing.assert_array_equal(out.numpy(), ref.detach().numpy())


def compare(fg_fn, th_fn, *arrays, view="contiguous", device="CPU", grad=True):
    """Run fg_fn and th_fn on the same inputs (seen through `view`); compare outputs and, for float inputs,
    gradients."""
    fg_in = [Tensor(a, device=device) for a in arrays]
    th_in = [torch.tensor(a, requires_grad=grad and a.dtype.kind == "f") for a in arrays]
    fg_out, th_out = fg_fn(*(VIEWS[view][0](t) for t in fg_in)), th_fn(*(VIEWS[view][1](t) for t in th_in))
    single = isinstance(th_out, torch.Tensor)
    fg_outs, th_outs = ([fg_out], [th_out]) if single else (list(fg_out), list(th_out))
    assert len(fg_outs) == len(th_outs), f"{len(fg_outs)} outputs, torch gives {len(th_outs)}"
    for o, r in zip(fg_outs, th_outs):
        check(o, r)
    targets = [i for i, a in enumerate(arrays) if a.dtype.kind == "f"]
    if not grad or not targets:
        return fg_outs
    weights = [rand(*r.shape, seed=7 + i) for i, r in enumerate(th_outs)]
    fg_loss = sum((o * Tensor(w, device=device)).sum() for o, w in zip(fg_outs, weights))
    th_loss = sum((r * torch.tensor(w)).sum() for r, w in zip(th_outs, weights))
    fg_grads = fg_loss.gradient(*(fg_in[i] for i in targets))
    th_grads = torch.autograd.grad(th_loss, [th_in[i] for i in targets], allow_unused=True)
    for i, g, tg in zip(targets, fg_grads, th_grads):
        tg = torch.zeros_like(th_in[i]) if tg is None else tg
        assert g.shape == arrays[i].shape and g.dtype == fg_in[i].dtype
        np.testing.assert_allclose(g.numpy(), tg.numpy(), atol=GRAD_ATOL, rtol=GRAD_RTOL)
    return fg_outs


def kernels(*tensors):
    GlobalCounters.reset()
    Tensor.realize_all(list(tensors))
    return GlobalCounters.kernel_count


# ---------------------------------------------------------------------------------------------------------------------
# G15: reshape, view, expand, permute, transpose, flatten, unflatten, squeeze, unsqueeze


@pytest.mark.parametrize(
    "shape,new",
    [
        ((2, 3, 4), (6, 4)),
        ((2, 3, 4), (-1,)),
        ((2, 3, 4), (4, -1, 2)),
        ((2, 3, 4), (24,)),
        ((1,), ()),
        ((), (1, 1)),
        ((0, 3), (3, 0, 1)),
        ((0, 3), (-1, 3)),
        ((4, 3), (3, 4)),
    ],
)
@pytest.mark.parametrize("op", ["reshape", "view"])
def test_reshape_view(shape, new, op):
    compare(lambda t: getattr(t, op)(new), lambda t: t.reshape(new), rand(*shape))
    if new:
        compare(lambda t: getattr(t, op)(*new), lambda t: t.reshape(new), rand(*shape))


def test_reshape_none_keeps_dim_and_forms():
    compare(lambda t: t.reshape(None, -1), lambda t: t.reshape(2, 12), rand(2, 3, 4))
    compare(lambda t: t.reshape([None, 3, None]), lambda t: t, rand(2, 3, 4))
    compare(lambda t: t.reshape(2, 6), lambda t: t.reshape(2, 6), rand(3, 4), view="permuted")
    compare(lambda t: t.view(-1), lambda t: t.reshape(-1), rand(4, 5), view="negstep")


@pytest.mark.parametrize("dtype", [np.int32, np.bool_, np.float16, np.uint8])
def test_reshape_dtypes(dtype):
    compare(lambda t: t.reshape(3, 2), lambda t: t.reshape(3, 2), rand(2, 3, dtype=dtype))


def test_reshape_errors():
    t = Tensor(rand(2, 6))
    with pytest.raises(RuntimeError, match=r"\(-1, -1\)"):
        t.reshape(-1, -1)
    with pytest.raises(ValueError, match=r"\(5, -1\)"):
        t.reshape(5, -1)
    with pytest.raises(ValueError, match=r"\(5, 3\)"):
        t.reshape(5, 3)
    with pytest.raises(ValueError, match=r"-2"):
        t.reshape(-2, 6)
    with pytest.raises(ValueError, match=r"None"):
        t.reshape(2, 6, None)


@pytest.mark.parametrize(
    "shape,new",
    [((3, 1), (2, 3, 4)), ((3, 1), (-1, 5)), ((1,), (0,)), ((), (2, 3)), ((1, 3), (4, 3)), ((2, 3), (2, 3))],
)
def test_expand(shape, new):
    compare(lambda t: t.expand(new), lambda t: t.expand(new), rand(*shape))
    compare(lambda t: t.expand(*new), lambda t: t.expand(*new), rand(*shape))


def test_expand_none_noncontiguous_and_errors():
    compare(lambda t: t.expand(2, None, 4), lambda t: t.expand(2, -1, 4), rand(3, 1))
    compare(
        lambda t: t.unsqueeze(0).expand(3, 4, 2), lambda t: t.unsqueeze(0).expand(3, 4, 2), rand(5, 4), view="sliced"
    )
    t = Tensor(rand(3, 2))
    with pytest.raises(ValueError, match=r"\(3, 4\)"):
        t.expand(3, 4)
    with pytest.raises(ValueError, match=r"\(2,\)"):
        t.expand(2)
    with pytest.raises(ValueError):
        t.expand(-1, 3, 2)


@pytest.mark.parametrize("order", [(0, 1, 2), (2, 0, 1), (1, 2, 0), (-1, 0, -2)])
@pytest.mark.parametrize("view", ["contiguous", "sliced", "negstep"])
def test_permute(order, view):
    compare(lambda t: t.permute(order), lambda t: t.permute(order), rand(3, 4, 5), view=view)
    compare(lambda t: t.permute(*order), lambda t: t.permute(*order), rand(3, 4, 5), view=view)


def test_permute_scalar_zero_size_and_errors():
    compare(lambda t: t.permute(()), lambda t: t.permute(()), rand())
    compare(lambda t: t.permute(1, 0, 2), lambda t: t.permute(1, 0, 2), rand(0, 3, 2))
    t = Tensor(rand(2, 6))
    with pytest.raises(RuntimeError, match=r"\(0, 0\)"):
        t.permute(0, 0)
    with pytest.raises(RuntimeError, match=r"\(0,\)"):
        t.permute(0)
    with pytest.raises(IndexError, match="2"):
        t.permute(0, 2)


@pytest.mark.parametrize("args", [(), (0, 2), (-1, -2), (1, 1), (2, 0)])
def test_transpose(args):
    fg_args, th_args = (args, args) if args else ((), (1, 0))
    compare(lambda t: t.transpose(*fg_args), lambda t: t.transpose(*th_args), rand(2, 3, 4), view="permuted")
    compare(lambda t: t.T, lambda t: t.T, rand(3, 4))
    compare(lambda t: t.transpose(0, -1), lambda t: t.transpose(0, -1), rand())


@pytest.mark.parametrize("start,end", [(0, -1), (1, 2), (0, 0), (-2, -1), (2, 2)])
def test_flatten(start, end):
    compare(lambda t: t.flatten(start, end), lambda t: t.flatten(start, end), rand(2, 3, 4), view="negstep")
    compare(lambda t: t.flatten(start, end), lambda t: t.flatten(start, end), rand(2, 0, 4))


def test_flatten_scalar_and_errors():
    compare(lambda t: t.flatten(), lambda t: t.flatten(), rand())
    with pytest.raises(RuntimeError, match="start_dim 2"):
        Tensor(rand(2, 3, 4)).flatten(2, 1)
    with pytest.raises(IndexError, match="3"):
        Tensor(rand(2, 3, 4)).flatten(3)


@pytest.mark.parametrize(
    "dim,sizes", [(1, (2, 3)), (1, (-1, 3)), (0, (1, 2)), (-1, (2, 2, 1)), (-1, (4, -1)), (1, (6,))]
)
def test_unflatten(dim, sizes):
    compare(lambda t: t.unflatten(dim, sizes), lambda t: t.unflatten(dim, sizes), rand(2, 6, 4))


def test_unflatten_errors():
    t = Tensor(rand(2, 6))
    with pytest.raises(RuntimeError, match=r"\(4, -1\)"):
        t.unflatten(1, (4, -1))
    with pytest.raises(RuntimeError, match=r"\(-1, -1\)"):
        t.unflatten(1, (-1, -1))
    with pytest.raises(RuntimeError, match=r"\(2, 2\)"):
        t.unflatten(1, (2, 2))


@pytest.mark.parametrize("dim", [None, 0, 1, 2, -1, -3, (0, 2), (1, 3)])
def test_squeeze(dim):
    if dim is None:
        compare(lambda t: t.squeeze(), lambda t: t.squeeze(), rand(1, 3, 1, 2))
    else:
        compare(lambda t: t.squeeze(dim), lambda t: t.squeeze(dim), rand(1, 3, 1, 2))


def test_squeeze_scalar_zero_size_and_errors():
    compare(lambda t: t.squeeze(), lambda t: t.squeeze(), rand())
    compare(lambda t: t.squeeze(0), lambda t: t.squeeze(0), rand())
    compare(lambda t: t.squeeze(), lambda t: t.squeeze(), rand(1, 0, 1))
    with pytest.raises(IndexError, match="4"):
        Tensor(rand(1, 2)).squeeze(4)


@pytest.mark.parametrize("dim", [0, 1, 2, 3, -1, -2, -4])
def test_unsqueeze(dim):
    compare(lambda t: t.unsqueeze(dim), lambda t: t.unsqueeze(dim), rand(3, 1, 2), view="permuted")


def test_unsqueeze_scalar_and_errors():
    compare(lambda t: t.unsqueeze(-1), lambda t: t.unsqueeze(-1), rand())
    with pytest.raises(IndexError, match="3"):
        Tensor(rand(3, 2)).unsqueeze(3)
    with pytest.raises(IndexError, match="-4"):
        Tensor(rand(3, 2)).unsqueeze(-4)


# ---------------------------------------------------------------------------------------------------------------------
# G15: flip, shrink, shrink_to, pad, pad_to, rearrange


@pytest.mark.parametrize("axes", [(0,), (1,), (-1,), (0, 2), (2, 0, 1)])
@pytest.mark.parametrize("view", ["contiguous", "negstep"])
def test_flip(axes, view):
    compare(lambda t: t.flip(axes), lambda t: t.flip(axes), rand(2, 3, 4), view=view)
    compare(lambda t: t.flip(*axes), lambda t: t.flip(axes), rand(2, 3, 4), view=view)


def test_flip_edge_and_errors():
    compare(lambda t: t.flip(0), lambda t: t.flip(0), rand(0, 3))
    compare(lambda t: t.flip(0), lambda t: t.flip(0), rand(1, dtype=np.int32))
    with pytest.raises(RuntimeError, match=r"\(0, -2\)"):
        Tensor(rand(2, 6)).flip(0, -2)
    with pytest.raises(IndexError, match="2"):
        Tensor(rand(2, 6)).flip(2)


@pytest.mark.parametrize(
    "arg,sl",
    [
        (((1, 3), None), (slice(1, 3), slice(None))),
        (((0, 0), (2, 4)), (slice(0, 0), slice(2, 4))),
        (((0, 4), (0, 5)), (slice(None), slice(None))),
        ((None, (4, 5)), (slice(None), slice(4, 5))),
    ],
)
def test_shrink(arg, sl):
    compare(lambda t: t.shrink(arg), lambda t: t[sl], rand(4, 5))
    compare(lambda t: t.shrink(arg), lambda t: t[sl], rand(5, 4), view="permuted")


def test_shrink_to_and_errors():
    compare(lambda t: t.shrink_to(2, None, 3), lambda t: t[:2, :, :3], rand(3, 4, 5))
    compare(lambda t: t.shrink_to((0, 4)), lambda t: t[:0, :4], rand(3, 4))
    with pytest.raises(ValueError, match=r"\(\(1, 5\), None\)"):
        Tensor(rand(4, 4)).shrink(((1, 5), None))
    with pytest.raises(ValueError, match="2"):
        Tensor(rand(4, 4)).shrink(((1, 2),))
    with pytest.raises(ValueError, match=r"\(5, 2\)"):
        Tensor(rand(4, 4)).shrink_to(5, 2)
    with pytest.raises(ValueError, match=r"\(2,\)"):
        Tensor(rand(4, 4)).shrink_to(2)


PADDINGS = [(1, 2), (2, 1, 0, 3), (0, 0, 1, 1), (3, 0, 2, 2), (-1, 2), (2, -1, -1, 3), (-2, -1), (1, 1, 1, 1, 1, 1)]


@pytest.mark.parametrize("padding", PADDINGS)
@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
def test_pad_modes(padding, mode):
    # torch's non-constant modes need a batch dim and pad at most the last ndim-1 dims
    shape = (2, 4, 5) if len(padding) < 6 or mode == "constant" else (2, 3, 4, 5)
    compare(lambda t: t.pad(padding, mode=mode), lambda t: F.pad(t, padding, mode=mode), rand(*shape))


@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("view", ["permuted", "negstep"])
def test_pad_modes_views(mode, view):
    compare(
        lambda t: t.pad((2, 1, 1, 2), mode=mode), lambda t: F.pad(t, (2, 1, 1, 2), mode=mode), rand(3, 4, 5), view=view
    )


def test_pad_grouped_form():
    compare(lambda t: t.pad(((1, 2), None, (0, 3))), lambda t: F.pad(t, (0, 3, 0, 0, 1, 2)), rand(2, 3, 4))
    compare(
        lambda t: t.pad(((0, 0), (1, 1), (2, 0)), mode="reflect"),
        lambda t: F.pad(t, (2, 0, 1, 1), mode="reflect"),
        rand(2, 3, 4),
    )
    compare(lambda t: t.pad([(1, -1), (-2, 2)]), lambda t: F.pad(t, (-2, 2, 1, -1)), rand(3, 4))


@pytest.mark.parametrize("value", [1.5, -2, math.inf, -math.inf, -0.0])
def test_pad_constant_value(value):
    compare(lambda t: t.pad((1, 2, 2, 0), value=value), lambda t: F.pad(t, (1, 2, 2, 0), value=value), rand(3, 4))
    out = Tensor(rand(3, 4)).pad((1, 1), value=value).numpy()
    assert np.all(np.signbit(out[:, 0]) == np.signbit(value))  # -0.0 is filled as -0.0


@pytest.mark.parametrize("dtype", [np.int32, np.int8, np.uint8, np.float16, np.bool_])
def test_pad_dtypes(dtype):
    compare(lambda t: t.pad((1, 2)), lambda t: F.pad(t, (1, 2)), rand(3, 4, dtype=dtype))
    compare(lambda t: t.pad((1, 2), value=1), lambda t: F.pad(t, (1, 2), value=1), rand(3, 4, dtype=dtype))
    if dtype != np.bool_:
        compare(
            lambda t: t.pad((2, 1, 1, 0), mode="reflect"),
            lambda t: F.pad(t, (2, 1, 1, 0), mode="reflect"),
            rand(1, 3, 4, dtype=dtype),
        )


def test_pad_scalar_zero_size_and_general_dims():
    compare(lambda t: t.pad(()), lambda t: F.pad(t, ()), rand())
    compare(lambda t: t.pad((1, 1, 0, 0)), lambda t: F.pad(t, (1, 1, 0, 0)), rand(0, 3))
    compare(lambda t: t.pad((2, 2), mode="circular"), lambda t: F.pad(t, (2, 2), mode="circular"), rand(0, 3))
    # fusegrad's non-constant modes work on any dim (torch needs a batch dim): check against the batched torch call
    compare(lambda t: t.pad((2, 3), mode="reflect"), lambda t: F.pad(t[None], (2, 3), mode="reflect")[0], rand(5))
    compare(
        lambda t: t.pad((1, 2, 1, 1, 2, 0), mode="replicate"),
        lambda t: F.pad(t[None, None], (1, 2, 1, 1, 2, 0), mode="replicate")[0, 0],
        rand(2, 3, 4),
    )


def test_pad_errors():
    t = Tensor(rand(2, 3, 4))
    with pytest.raises(NotImplementedError, match="'wrap'"):
        t.pad((1, 1), mode="wrap")
    with pytest.raises(ValueError, match=r"\(1, 0, 1\)"):
        t.pad((1, 0, 1))
    with pytest.raises(ValueError, match=r"\(1, 1, 1, 1, 1, 1, 1, 1\)"):
        t.pad((1,) * 8)
    with pytest.raises(ValueError):
        t.pad(((1, 1), (1, 1)))
    with pytest.raises(RuntimeError, match=r"\(4, 0\).*size 4"):
        t.pad((4, 0), mode="reflect")
    with pytest.raises(RuntimeError, match=r"\(0, 5\).*size 4"):
        t.pad((0, 5), mode="circular")
    with pytest.raises(RuntimeError, match=r"\(-3, -2\)"):
        t.pad((-3, -2))
    with pytest.raises(RuntimeError, match="replicate.*size 0"):
        Tensor(rand(2, 0)).pad((1, 0), mode="replicate")
    with pytest.raises(RuntimeError, match="value"):
        t.pad((1, 1), mode="reflect", value=3)


def test_pad_to():
    compare(lambda t: t.pad_to(4, None, 6), lambda t: F.pad(t, (0, 2, 0, 0, 0, 1)), rand(3, 2, 4))
    compare(lambda t: t.pad_to((3, 5), value=-1), lambda t: F.pad(t, (0, 3, 0, 0), value=-1), rand(3, 2))
    with pytest.raises(ValueError, match=r"\(2, 2\)"):
        Tensor(rand(3, 2)).pad_to(2, 2)
    with pytest.raises(ValueError, match=r"\(4,\)"):
        Tensor(rand(3, 2)).pad_to(4)


REARRANGES = [
    ("b c h w -> b h w c", {}, lambda t: t.permute(0, 2, 3, 1)),
    ("b c (h w) -> b c h w", {"h": 2}, lambda t: t.reshape(2, 3, 2, 2)),
    ("b c (h w) -> b (c h) w", {"h": 2}, lambda t: t.reshape(2, 3, 2, 2).reshape(2, 6, 2)),
    ("b c (h w) -> w b c h", {"w": 2}, lambda t: t.reshape(2, 3, 2, 2).permute(3, 0, 1, 2)),
    ("b ... -> ... b", {}, lambda t: t.permute(1, 2, 0)),
    ("... c d -> ... (d c)", {}, lambda t: t.transpose(-1, -2).reshape(2, 12)),
    ("b c d -> b () c 1 d", {}, lambda t: t.reshape(2, 1, 3, 1, 4)),
    ("b c d -> (b c d)", {}, lambda t: t.reshape(24)),
    ("b (c1 c2) d -> c2 b c1 d", {"c1": 3, "c2": 1}, lambda t: t.reshape(2, 3, 1, 4).permute(2, 0, 1, 3)),
]


@pytest.mark.parametrize("formula,sizes,ref", REARRANGES)
def test_rearrange(formula, sizes, ref):
    arr = rand(2, 3, 4, 5) if formula.startswith("b c h w") else rand(2, 3, 4)
    compare(lambda t: t.rearrange(formula, **sizes), ref, arr)


def test_rearrange_errors():
    t = Tensor(rand(2, 3, 4))
    with pytest.raises(ValueError, match="'b c -> c b'"):
        t.rearrange("b c -> c b")
    with pytest.raises(ValueError, match="each axis once"):
        t.rearrange("b c d -> b c")
    with pytest.raises(ValueError, match="each axis once"):
        t.rearrange("b b d -> b d")
    with pytest.raises(ValueError, match="infer"):
        t.rearrange("b c (d e f) -> b c d e f", d=2)
    with pytest.raises(ValueError, match="'e': 3"):
        t.rearrange("b c (d e) -> b c d e", e=3)
    with pytest.raises(ValueError, match="'x'"):
        t.rearrange("b c d -> b c d", x=3)
    with pytest.raises(ValueError, match="'...'"):
        t.rearrange("b ... -> b")
    with pytest.raises(ValueError, match="->"):
        t.rearrange("b c d")
    with pytest.raises(ValueError, match=r"'\('"):
        t.rearrange("b c (d -> b c d")


# ---------------------------------------------------------------------------------------------------------------------
# G16: cat, stack, split, chunk


@pytest.mark.parametrize("dim", [0, 1, -1, -3])
@pytest.mark.parametrize("view", ["contiguous", "sliced", "negstep"])
def test_cat(dim, view):
    shapes = [[5, 4, 5], [5, 4, 5], [5, 4, 5]]
    for s, n in zip(shapes, (3, 5, 7)):
        s[dim] = n
    compare(
        lambda a, b, c: a.cat(b, c, dim=dim),
        lambda a, b, c: torch.cat([a, b, c], dim),
        *(rand(*s) for s in shapes),
        view=view,
    )


def test_cat_forms_and_edges():
    a, b = rand(2, 3), rand(4, 3)
    compare(lambda a, b: Tensor.cat(a, b, dim=0), lambda a, b: torch.cat([a, b]), a, b)
    compare(lambda a, b: Tensor.cat([a, b]), lambda a, b: torch.cat([a, b]), a, b)
    compare(lambda a: a.cat(), lambda a: torch.cat([a]), a)
    compare(lambda a, b: a.cat(b, dim=1), lambda a, b: torch.cat([a, b], 1), rand(2, 0), rand(2, 3))
    compare(lambda a, b: a.cat(b), lambda a, b: torch.cat([a, b]), rand(0, 3), rand(0, 3))
    compare(lambda a, b: a.cat(b), lambda a, b: torch.cat([a, b]), rand(0), rand(2, 3))  # legacy: 1-D empty is skipped
    compare(lambda a, b: a.cat(b), lambda a, b: torch.cat([a, b]), rand(3), rand(2))


@pytest.mark.parametrize(
    "dts",
    [
        (np.int32, np.float32),
        (np.int8, np.uint8),
        (np.bool_, np.int32),
        (np.bool_, np.bool_),
        (np.float16, np.float32),
        (np.int64, np.int32),
    ],
)
def test_cat_dtype_promotion(dts):
    compare(
        lambda a, b: a.cat(b, dim=1),
        lambda a, b: torch.cat([a, b], 1),
        rand(2, 3, dtype=dts[0]),
        rand(2, 2, dtype=dts[1]),
    )


def test_cat_negative_zero_is_kept():
    out = Tensor([-0.0, 1.0]).cat(Tensor([-0.0])).numpy()
    assert np.signbit(out).tolist() == [True, False, True]


def test_cat_errors():
    a = Tensor(rand(2, 3))
    with pytest.raises(RuntimeError, match=r"\(3, 2\)"):
        a.cat(Tensor(rand(3, 2)))
    with pytest.raises(RuntimeError, match=r"\(2,\)"):
        a.cat(Tensor(rand(2)))
    with pytest.raises(RuntimeError, match="zero-dimensional"):
        Tensor(1.0).cat(Tensor(2.0))
    with pytest.raises(IndexError, match="2"):
        a.cat(a, dim=2)
    with pytest.raises(ValueError, match="non-empty"):
        Tensor.cat([])


@pytest.mark.parametrize("n", [2, 4, 8])
def test_cat_is_one_kernel(n):
    pieces = [Tensor(rand(3, i + 1)) for i in range(n)]
    assert kernels(pieces[0].cat(*pieces[1:], dim=1)) == 1
    assert kernels(Tensor.stack(*pieces[:1] * n, dim=1)) == 1


@pytest.mark.parametrize("dim", [0, 1, 2, -1, -3])
def test_stack(dim):
    compare(
        lambda a, b, c: Tensor.stack(a, b, c, dim=dim),
        lambda a, b, c: torch.stack([a, b, c], dim),
        rand(3, 4),
        rand(3, 4),
        rand(3, 4),
        view="negstep",
    )


def test_stack_edges_and_errors():
    compare(lambda a, b: a.stack(b), lambda a, b: torch.stack([a, b]), rand(), rand())
    compare(lambda a, b: a.stack(b, dim=1), lambda a, b: torch.stack([a, b], 1), rand(0, 2), rand(0, 2))
    compare(
        lambda a, b: Tensor.stack([a, b], dim=-1),
        lambda a, b: torch.stack([a, b], -1),
        rand(2, dtype=np.int32),
        rand(2, dtype=np.int32),
    )
    with pytest.raises(RuntimeError, match=r"\(3, 2\)"):
        Tensor(rand(2, 3)).stack(Tensor(rand(3, 2)))
    with pytest.raises(IndexError, match="3"):
        Tensor(rand(2, 3)).stack(Tensor(rand(2, 3)), dim=3)


@pytest.mark.parametrize(
    "sizes,dim", [(2, 0), (3, 1), (4, 1), (1, -1), (10, 0), ([1, 3, 2], 1), ([0, 5], 0), ([6], -2)]
)
def test_split(sizes, dim):
    compare(lambda t: t.split(sizes, dim), lambda t: t.split(sizes, dim), rand(5, 6, 4))
    if isinstance(sizes, int):
        compare(lambda t: t.split(sizes, dim), lambda t: t.split(sizes, dim), rand(6, 6, 12), view="sliced")


def test_split_edges_and_errors():
    outs = compare(lambda t: t.split(2), lambda t: t.split(2), rand(0, 3))
    assert len(outs) == 1
    assert isinstance(Tensor(rand(4)).split(2), tuple)
    t = Tensor(rand(6, 2))
    with pytest.raises(RuntimeError, match=r"\(2, 3\).*6"):
        t.split([2, 3])
    with pytest.raises(RuntimeError, match=r"-1"):
        t.split([2, -1, 5])
    with pytest.raises(RuntimeError, match="0"):
        t.split(0)
    with pytest.raises(IndexError, match="2"):
        t.split(1, 2)


@pytest.mark.parametrize("n,chunks", [(6, 3), (6, 4), (5, 2), (5, 5), (3, 7), (1, 1)])
def test_chunk(n, chunks):
    outs = compare(lambda t: t.chunk(chunks, 1), lambda t: t.chunk(chunks, 1), rand(2, n))
    assert isinstance(outs, list)
    compare(lambda t: t.chunk(chunks), lambda t: t.chunk(chunks), rand(n, 2), view="negstep")


def test_chunk_edges_and_errors():
    assert len(compare(lambda t: t.chunk(3), lambda t: t.chunk(3), rand(0, 2))) == 3
    assert isinstance(Tensor(rand(4)).chunk(2), list)
    with pytest.raises(RuntimeError, match="0"):
        Tensor(rand(4)).chunk(0)
    with pytest.raises(IndexError, match="1"):
        Tensor(rand(4)).chunk(2, 1)


# ---------------------------------------------------------------------------------------------------------------------
# G16: repeat, repeat_interleave, roll


@pytest.mark.parametrize("reps", [(2, 3), (1, 1), (3, 1, 2), (2, 1, 1, 1), (0, 2)])
@pytest.mark.parametrize("view", ["contiguous", "permuted"])
def test_repeat(reps, view):
    compare(lambda t: t.repeat(reps), lambda t: t.repeat(reps), rand(2, 3), view=view)
    compare(lambda t: t.repeat(*reps), lambda t: t.repeat(*reps), rand(2, 3), view=view)


def test_repeat_edges_and_errors():
    compare(lambda t: t.repeat(2, 3), lambda t: t.repeat(2, 3), rand())
    compare(lambda t: t.repeat(2, 3), lambda t: t.repeat(2, 3), rand(0, 2))
    compare(lambda t: t.repeat(3), lambda t: t.repeat(3), rand(4, dtype=np.bool_))
    assert kernels(Tensor(rand(3, 4)).repeat(2, 2, 3).contiguous()) == 1
    with pytest.raises(RuntimeError, match=r"\(2,\)"):
        Tensor(rand(2, 3)).repeat(2)
    with pytest.raises(RuntimeError, match=r"-1"):
        Tensor(rand(2, 3)).repeat(2, -1)


@pytest.mark.parametrize("repeats,dim", [(2, None), (3, 0), (2, 1), (1, -1), (0, 1), (4, -2)])
def test_repeat_interleave(repeats, dim):
    compare(
        lambda t: t.repeat_interleave(repeats, dim),
        lambda t: t.repeat_interleave(repeats, dim),
        rand(3, 4),
        view="negstep",
    )


def test_repeat_interleave_edges_and_errors():
    compare(lambda t: t.repeat_interleave(3), lambda t: t.repeat_interleave(3), rand())
    compare(lambda t: t.repeat_interleave(2, 0), lambda t: t.repeat_interleave(2, 0), rand(0, 3, dtype=np.int32))
    with pytest.raises(RuntimeError, match="-1"):
        Tensor(rand(2, 3)).repeat_interleave(-1)
    with pytest.raises(IndexError, match="5"):
        Tensor(rand(2, 3)).repeat_interleave(2, dim=5)


@pytest.mark.parametrize(
    "shifts,dims",
    [
        (1, 0),
        (-1, 1),
        (7, -1),
        ((1, 2), (0, 1)),
        ((2, -3), (1, 1)),
        (5, None),
        (-13, None),
        ((2,), None),
        (0, 0),
        (3, 0),
    ],
)
@pytest.mark.parametrize("view", ["contiguous", "sliced"])
def test_roll(shifts, dims, view):
    compare(lambda t: t.roll(shifts, dims), lambda t: t.roll(shifts, dims), rand(3, 4, 5), view=view)


def test_roll_edges_and_errors():
    compare(lambda t: t.roll(1, 0), lambda t: t.roll(1, 0), rand(0, 3))
    compare(lambda t: t.roll(3), lambda t: t.roll(3), rand())
    compare(lambda t: t.roll(2, 0), lambda t: t.roll(2, 0), rand(5, dtype=np.int64))
    assert kernels(Tensor(rand(4, 5)).roll((1, 2), (0, 1)).contiguous()) == 1
    t = Tensor(rand(2, 3))
    with pytest.raises(RuntimeError, match=r"\(1, 2\)"):
        t.roll((1, 2))
    with pytest.raises(RuntimeError, match=r"\(1, 2\).*\(0,\)"):
        t.roll((1, 2), (0,))
    with pytest.raises(IndexError, match="2"):
        t.roll(1, 2)


# ---------------------------------------------------------------------------------------------------------------------
# G16: unfold, meshgrid, diag, diagonal, triu, tril


@pytest.mark.parametrize(
    "dim,size,step",
    [(0, 2, 1), (1, 3, 1), (1, 2, 2), (-1, 1, 3), (1, 6, 1), (1, 4, 5), (0, 0, 1), (-1, 3, 2), (1, 1, 1)],
)
@pytest.mark.parametrize("view", ["contiguous", "negstep"])
def test_unfold(dim, size, step, view):
    compare(lambda t: t.unfold(dim, size, step), lambda t: t.unfold(dim, size, step), rand(5, 6, 7), view=view)


def test_unfold_edges_and_errors():
    compare(lambda t: t.unfold(0, 1, 1), lambda t: t.unfold(0, 1, 1), rand())
    compare(lambda t: t.unfold(1, 2, 1), lambda t: t.unfold(1, 2, 1), rand(0, 4))
    compare(lambda t: t.unfold(0, 3, 2), lambda t: t.unfold(0, 3, 2), rand(9, dtype=np.int32))
    assert kernels(Tensor(rand(4, 9)).unfold(1, 3, 2).contiguous()) == 1
    t = Tensor(rand(2, 6))
    with pytest.raises(RuntimeError, match="size 7.*6"):
        t.unfold(1, 7, 1)
    with pytest.raises(RuntimeError, match="step 0"):
        t.unfold(1, 2, 0)
    with pytest.raises(IndexError, match="2"):
        t.unfold(2, 1, 1)


@pytest.mark.parametrize("indexing", ["ij", "xy"])
@pytest.mark.parametrize("sizes", [(3,), (3, 4), (2, 3, 4), (0, 2), (1, 1, 2)])
def test_meshgrid(indexing, sizes):
    arrays = [rand(n, seed=i) for i, n in enumerate(sizes)]
    compare(
        lambda *ts: ts[0].meshgrid(*ts[1:], indexing=indexing),
        lambda *ts: torch.meshgrid(*ts, indexing=indexing),
        *arrays,
    )


def test_meshgrid_edges_and_errors():
    compare(lambda a, b: a.meshgrid(b), lambda a, b: torch.meshgrid(a, b, indexing="ij"), rand(), rand(3))
    compare(
        lambda a, b: a.meshgrid(b, indexing="xy"),
        lambda a, b: torch.meshgrid(a, b, indexing="xy"),
        rand(5, dtype=np.int32),
        rand(2, dtype=np.int32),
    )
    assert isinstance(Tensor(rand(2)).meshgrid(Tensor(rand(2))), tuple)
    with pytest.raises(RuntimeError, match="'foo'"):
        Tensor(rand(2)).meshgrid(indexing="foo")
    with pytest.raises(RuntimeError, match=r"\(2, 2\)"):
        Tensor(rand(2)).meshgrid(Tensor(rand(2, 2)))


@pytest.mark.parametrize("n", [0, 1, 4])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.bool_])
def test_diag(n, dtype):
    compare(lambda t: t.diag(), lambda t: t.diag(), rand(n, dtype=dtype))


def test_diag_views_and_errors():
    compare(lambda t: t.diag(), lambda t: t.diag(), rand(7), view="negstep")
    assert kernels(Tensor(rand(5)).diag().contiguous()) == 1
    with pytest.raises(ValueError, match=r"\(2, 2\)"):
        Tensor(rand(2, 2)).diag()
    with pytest.raises(ValueError, match=r"\(\)"):
        Tensor(1.0).diag()


@pytest.mark.parametrize("offset", [0, 1, 2, -1, -3, 5, -6])
@pytest.mark.parametrize("dim1,dim2", [(0, 1), (1, 0), (1, 2), (-1, 0), (2, -2)])
def test_diagonal(offset, dim1, dim2):
    compare(lambda t: t.diagonal(offset, dim1, dim2), lambda t: t.diagonal(offset, dim1, dim2), rand(3, 4, 5))


def test_diagonal_edges_and_errors():
    compare(lambda t: t.diagonal(), lambda t: t.diagonal(), rand(4, 4), view="negstep")
    compare(lambda t: t.diagonal(1), lambda t: t.diagonal(1), rand(4, 3), view="permuted")
    compare(lambda t: t.diagonal(0, 0, 2), lambda t: t.diagonal(0, 0, 2), rand(2, 0, 3))
    compare(lambda t: t.diagonal(offset=-1), lambda t: t.diagonal(offset=-1), rand(3, 3, dtype=np.int32))
    assert kernels(Tensor(rand(2, 4, 4)).diagonal(1, 1, 2).contiguous()) == 1
    with pytest.raises(RuntimeError, match="dim1=1, dim2=-1"):
        Tensor(rand(3, 3)).diagonal(0, 1, -1)
    with pytest.raises(IndexError, match="1"):
        Tensor(rand(3)).diagonal()


@pytest.mark.parametrize("diagonal", [0, 1, -1, 3, -4, 10])
@pytest.mark.parametrize("shape", [(4, 4), (3, 5), (2, 5, 3), (0, 3)])
@pytest.mark.parametrize("op", ["triu", "tril"])
def test_triangle(op, shape, diagonal):
    compare(lambda t: getattr(t, op)(diagonal), lambda t: getattr(t, op)(diagonal), rand(*shape))


@pytest.mark.parametrize("op", ["triu", "tril"])
@pytest.mark.parametrize("dtype", [np.int32, np.bool_, np.float16, np.uint8])
def test_triangle_dtypes_views_and_errors(op, dtype):
    compare(lambda t: getattr(t, op)(), lambda t: getattr(t, op)(), rand(4, 5, dtype=dtype))
    compare(lambda t: getattr(t, op)(1), lambda t: getattr(t, op)(1), rand(4, 5), view="negstep")
    compare(lambda t: getattr(t, op)(-1), lambda t: getattr(t, op)(-1), rand(4, 5), view="permuted")
    assert kernels(getattr(Tensor(rand(3, 3, 3)), op)()) == 1
    nan = np.array([[np.nan, np.inf], [-np.inf, np.nan]], dtype=np.float32)
    compare(
        lambda t: getattr(t, op)(), lambda t: getattr(t, op)(), nan, grad=False
    )  # masked, not multiplied: NaN stays put
    with pytest.raises(RuntimeError, match=r"\(3,\)"):
        getattr(Tensor(rand(3)), op)()


# ---------------------------------------------------------------------------------------------------------------------
# the PYTHON device runs the same kernels through the interpreter: a representative subset on tiny tensors

PYTHON_CASES = [
    (lambda a, b: a.cat(b, dim=1), lambda a, b: torch.cat([a, b], 1), (rand(2, 3), rand(2, 2))),
    (lambda a, b: a.stack(b, dim=-1), lambda a, b: torch.stack([a, b], -1), (rand(2, 3), rand(2, 3))),
    (lambda t: t.pad((2, 1, 1, 1), mode="reflect"), lambda t: F.pad(t, (2, 1, 1, 1), mode="reflect"), (rand(1, 3, 4),)),
    (lambda t: t.pad((1, 2), mode="circular"), lambda t: F.pad(t, (1, 2), mode="circular"), (rand(2, 3),)),
    (lambda t: t.pad((1, -1), value=2.0), lambda t: F.pad(t, (1, -1), value=2.0), (rand(2, 3),)),
    (lambda t: t.roll((1, -1), (0, 1)), lambda t: t.roll((1, -1), (0, 1)), (rand(3, 4),)),
    (lambda t: t.unfold(1, 2, 2), lambda t: t.unfold(1, 2, 2), (rand(2, 5),)),
    (lambda t: t.repeat(2, 1, 2), lambda t: t.repeat(2, 1, 2), (rand(2, 3),)),
    (lambda t: t.repeat_interleave(2, 0), lambda t: t.repeat_interleave(2, 0), (rand(2, 3),)),
    (lambda t: t.diagonal(1), lambda t: t.diagonal(1), (rand(4, 4),)),
    (lambda t: t.diag(), lambda t: t.diag(), (rand(3),)),
    (lambda t: t.triu(1), lambda t: t.triu(1), (rand(3, 4),)),
    (lambda t: t.split([1, 2], 1), lambda t: t.split([1, 2], 1), (rand(2, 6),)),
    (lambda t: t.rearrange("a (b c) -> c a b", c=2), lambda t: t.reshape(2, 2, 2).permute(2, 0, 1), (rand(2, 8),)),
    (lambda a, b: a.meshgrid(b, indexing="xy"), lambda a, b: torch.meshgrid(a, b, indexing="xy"), (rand(2), rand(3))),
]


@pytest.mark.parametrize("case", range(len(PYTHON_CASES)))
def test_python_device(case):
    fg_fn, th_fn, arrays = PYTHON_CASES[case]
    compare(fg_fn, th_fn, *arrays, device="PYTHON", view="negstep" if arrays[0].ndim == 2 else "contiguous")
