"""GPT-2 against transformers' GPT2LMHeadModel on random small configs saved with save_pretrained: logits, cached
decoding and greedy generation; sampling rules against their definition."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", reason="the test extra installs transformers")

from fusegrad import Context, GlobalCounters  # noqa: E402
from fusegrad.models.generate import Sampling, generate, prefill, sample  # noqa: E402
from fusegrad.models.gpt2 import GPT2  # noqa: E402

CONFIGS = {
    "small": dict(vocab_size=96, n_positions=64, n_embd=32, n_layer=2, n_head=4),
    "gelu-inner": dict(
        vocab_size=80, n_positions=48, n_embd=24, n_layer=1, n_head=2, n_inner=40, activation_function="gelu"
    ),
}


def reference(tmp_path, name):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(**CONFIGS[name], bos_token_id=0, eos_token_id=0)
    ref = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # weights larger than the default init, so greedy decoding does not settle on one token
        for p in ref.parameters():
            p.normal_(0, 0.3)
    ref.save_pretrained(tmp_path)
    return ref, GPT2.from_pretrained(tmp_path)


# gelu-inner (its own inner width and exact GELU) with the slow tests, in CI
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "gelu-inner" else n for n in CONFIGS])
def test_logits_and_greedy_tokens_match_transformers(tmp_path, name):
    ref, model = reference(tmp_path, name)
    ids = np.random.default_rng(1).integers(0, ref.config.vocab_size, 37)  # longer than a 32-token prefill chunk
    with torch.no_grad():
        want = ref(torch.tensor(ids[None])).logits[0].numpy()
    np.testing.assert_allclose(model.forward(ids, 0).numpy(), want, atol=1e-4, rtol=1e-4)
    model.reset()
    np.testing.assert_allclose(prefill(model, ids.tolist()), want[-1], atol=1e-4, rtol=1e-4)  # chunked, cached
    model.reset()
    prompt = ids[:5]
    with torch.no_grad():
        greedy = ref.generate(torch.tensor(prompt[None]), max_new_tokens=20, do_sample=False, min_new_tokens=20)
    assert list(generate(model, prompt.tolist(), 20)) == greedy[0, 5:].tolist()


def test_decode_replays_one_capture_for_every_position(tmp_path):
    """The position is a bound Variable: after the decode step is captured, later positions compile nothing and
    replay the same capture."""
    _, model = reference(tmp_path, "small")
    tokens = generate(model, [3, 1, 4, 1, 5], 20)
    first = [next(tokens) for _ in range(4)]  # prefill, then decode steps run eagerly and captured
    decode_step = model._steps[(1, False)]
    captured, compiled = decode_step.captured, GlobalCounters.compile_count
    assert captured is not None
    rest = list(tokens)
    assert len(first + rest) == 20
    assert GlobalCounters.compile_count == compiled
    assert decode_step.captured is captured and decode_step.cnt == 19


def test_decode_cache_write_computes_the_new_row_once(tmp_path, monkeypatch):
    """The cache write stores through its view of the cache: its output loops cover the new row only (it was a where
    over the whole cache), so the key/value projection fused into it runs once per row element."""
    import fusegrad.engine.realize as realize
    from fusegrad.codegen.lowerer import lower_kernel
    from fusegrad.uop.ops import Ops

    _, model = reference(tmp_path, "small")
    prefill(model, [3, 1, 4])
    asts, get_runner = [], realize.get_runner
    monkeypatch.setattr(
        realize, "get_runner", lambda device, ast, *rest: asts.append(ast) or get_runner(device, ast, *rest)
    )
    with Context(JIT=0):
        model.forward(np.array([5]), 3).numpy()
    assert model._caches is not None
    cache = model._caches[0].k
    writes = [a for a in asts if a.src[0].src[0].op is not Ops.DEFINE_GLOBAL]
    assert len(writes) == 2 * len(model._caches)
    for ast in writes:
        target = ast.src[0].src[0]
        while target.op is not Ops.DEFINE_GLOBAL:
            target = target.src[0]
        assert target.arg[1] == cache.numel()
        loops = [u for u in lower_kernel(ast).toposort() if u.op is Ops.RANGE and u.arg[1] == "global"]
        assert math.prod(r.src[0].arg for r in loops) == cache.numel() // model.max_context


def test_sampled_generation_is_seeded_and_top_k_1_is_greedy(tmp_path):
    _, model = reference(tmp_path, "small")
    prompt = [3, 1, 4, 1, 5]
    runs = []
    for sampling, seed in ((Sampling(temperature=0.9, top_p=0.9), 7), (Sampling(temperature=0.9, top_p=0.9), 7)):
        model.reset()
        runs.append(list(generate(model, prompt, 12, sampling, seed=seed)))
    assert runs[0] == runs[1]
    model.reset()
    greedy = list(generate(model, prompt, 12))
    model.reset()
    assert list(generate(model, prompt, 12, Sampling(temperature=1.5, top_k=1), seed=3)) == greedy


def test_sample_respects_top_k_and_top_p():
    rng = np.random.default_rng(0)
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    draws = [sample(logits, Sampling(temperature=1.0, top_k=2), rng) for _ in range(400)]
    assert set(draws) == {0, 1} and 0.5 < draws.count(0) / 400 < 0.75  # 0.5 / 0.8 = 0.625
    draws = [sample(logits, Sampling(temperature=1.0, top_p=0.7), rng) for _ in range(200)]
    assert set(draws) == {0, 1}  # 0.5 < 0.7 needs the second token, and 0.8 >= 0.7 stops there
    assert sample(logits, Sampling(), rng) == 0
    with pytest.raises(ValueError, match="top_p"):
        Sampling(top_p=0)


def test_bad_input_raises(tmp_path):
    _, model = reference(tmp_path, "small")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model.forward(np.array([1, 96]), 0)
    with pytest.raises(ValueError, match="context of 64"):
        list(generate(model, list(range(65)), 1))
