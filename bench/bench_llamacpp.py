"""fusegrad against llama.cpp (through llama-cpp-python) on the same GGUF files, in one process:
`python bench/bench_llamacpp.py [speed] [accuracy] [decode-cpu] [prefill-cpu] [--formats F32,Q8_0,Q4_K]` (the first
two without arguments).

- speed: a ~110M-parameter random LLaMA (12 layers of 768, SwiGLU 2048, 12 heads / 4 kv heads, vocabulary 32000)
  written once per format; prefill of 128 and 512 tokens (timed to the last token's logits) and greedy decode of
  128 tokens after a 4-token prompt, tokens/s. The cases run in turns, 3 rounds, medians.
- accuracy: the summed log-probability of a 512-token random text under F32 (fusegrad, llama.cpp, transformers) and
  under Q8_0 and Q4_K files made from the F32 file by llama.cpp's own quantizer (fusegrad, llama.cpp), with each
  format's drift against F32 on each side; and fusegrad's one token at a time (a decode step's path: where the CPU
  has 8-bit dot products, Q8_0 activations quantized to 8 bits as llama.cpp's are), with its drift against F32.
  (The speed files' K-quant blocks are random: any bytes time the same.)
- decode-cpu: greedy decode of 32 tokens after a 4-token prompt on the speed files, 5 rounds in turns, medians of
  the process's CPU time (time.process_time: both sides' threads, none of the time the machine ran other work) and
  of wall time; steadier than speed's wall-clock rates on a loaded machine (run it with NUM_CPU_THREADS=1 there).
- prefill-cpu: prefill of 128 and 512 tokens on the speed files, timed as decode-cpu is.
Both sides run on NUM_CPU_THREADS threads (llama.cpp's n_threads and n_threads_batch). llama-cpp-python is a
bench-only dependency: `pip install llama-cpp-python` builds llama.cpp from source (a few minutes on 2 cores).
The files carry no tokenizer (`tokenizer.ggml.model = no_vocab`): both sides read token ids."""

from __future__ import annotations

import ctypes
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "models"))  # the GGUF model maker

from bench_models import LLAMA_SHAPE, WARMUPS, fusegrad_cases, interleaved_rates  # noqa: E402  (this script's folder is on the path)
from fusegrad.helpers import NUM_CPU_THREADS  # noqa: E402

PROMPTS, DECODE, TEXT = (128, 512), 128, 512
CPU_DECODE, CPU_ROUNDS = 32, 5


def write_model(folder: str, qtype: str):
    """(path of the GGUF file, the transformers model holding the file's weights dequantized)."""
    from gguf_models import make_model, write_gguf

    ref = make_model("llama", std=0.02, **LLAMA_SHAPE)
    path = Path(folder) / f"llama-{qtype}.gguf"
    write_gguf(ref, "llama", path, None if qtype == "F32" else qtype, tokenizer={"add_tokenizer_model": "no_vocab"})
    return path, ref


def load_llamacpp(path: Path, logits_all: bool = False):
    import llama_cpp

    threads = NUM_CPU_THREADS.value
    return llama_cpp.Llama(
        str(path),
        n_ctx=max(PROMPTS),  # the longest prompt and the text fit; llama.cpp pads a context to 256s
        n_batch=512,
        n_ubatch=512,
        n_threads=threads,
        n_threads_batch=threads,
        logits_all=logits_all,
        verbose=False,
    )


def llamacpp_last_logits(llm) -> np.ndarray:
    import llama_cpp

    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(llm.n_vocab(),))


def llamacpp_decode(llm, prompt: list[int], n: int) -> None:
    """Greedy decode of n tokens after prompt's first 4, one token at a time through the KV cache, as generate()
    does."""
    llm.reset()
    llm.eval(prompt[:4])
    for _ in range(n - 1):
        llm.eval([int(llamacpp_last_logits(llm).argmax())])


def bench_prompt() -> list[int]:
    return np.random.default_rng(0).integers(0, LLAMA_SHAPE["vocab_size"], max(PROMPTS)).tolist()


def both_models(formats: list[str]):
    """Per format: (its name, fusegrad's model, llama.cpp's) of one fresh GGUF file, deleted after the caller's turn."""
    from fusegrad.models.llama import Llama

    for qtype in formats:
        with tempfile.TemporaryDirectory() as d:
            path, _ = write_model(d, qtype)
            model, _ = Llama.from_gguf(path, progress=False)
            yield qtype, model, load_llamacpp(path)


def cpu_time_rates(sides: list[tuple[object, int]]) -> tuple[list[float], list[float]]:
    """(tokens per CPU second, tokens per wall second) of each (case, tokens), CPU_ROUNDS rounds in turns, medians."""
    import statistics
    import time

    for _ in range(WARMUPS):  # captures, first replays, first touches
        for side, _ in sides:
            side()
    cpu: list[list[float]] = [[] for _ in sides]
    wall: list[list[float]] = [[] for _ in sides]
    for _ in range(CPU_ROUNDS):
        for i, (side, _) in enumerate(sides):
            c, w = time.process_time(), time.perf_counter()
            side()
            cpu[i].append(time.process_time() - c)
            wall[i].append(time.perf_counter() - w)
    return (
        [n / statistics.median(t) for (_, n), t in zip(sides, cpu)],
        [n / statistics.median(t) for (_, n), t in zip(sides, wall)],
    )


def bench_cpu(formats: list[str], prefill: bool) -> None:
    """decode-cpu, or prefill-cpu: each case's tokens per CPU second and per wall second, fusegrad and llama.cpp."""
    prompt = bench_prompt()
    head = f"{'CPU: fusegrad':>13s} {'llama.cpp':>10s} {'ratio':>6s} {'wall: fusegrad':>14s} {'llama.cpp':>10s}"
    print(f"{'case':24s} {head} {'ratio':>6s}")
    for qtype, model, llm in both_models(formats):
        ours_prefill, ours_decode = fusegrad_cases(model, prompt, CPU_DECODE)

        def theirs_prefill(n: int):
            llm.reset()
            llm.eval(prompt[:n])
            llamacpp_last_logits(llm)

        if prefill:
            names = [f"prefill {n}" for n in PROMPTS]
            sides = [(lambda n=n, f=f: f(n), n) for n in PROMPTS for f in (ours_prefill, theirs_prefill)]
        else:
            names = [f"decode {CPU_DECODE}"]
            sides = [(ours_decode, CPU_DECODE), (lambda: llamacpp_decode(llm, prompt, CPU_DECODE), CPU_DECODE)]
        cpu, wall = cpu_time_rates(sides)
        for i, name in enumerate(names):
            c0, c1, w0, w1 = cpu[2 * i], cpu[2 * i + 1], wall[2 * i], wall[2 * i + 1]
            print(
                f"{'LLaMA 110M ' + qtype + ' ' + name:24s} {c0:13.1f} {c1:10.1f} {c0 / c1:5.2f}x {w0:14.1f} {w1:10.1f}"
                f" {w0 / w1:5.2f}x",
                flush=True,
            )


def bench_speed(formats: list[str]) -> None:
    prompt = bench_prompt()
    print(f"{'case':36s} {'fusegrad':>10s} {'llama.cpp':>10s} {'unit':6s} {'ratio':>7s}")
    for qtype, model, llm in both_models(formats):
        ours_prefill, ours_decode = fusegrad_cases(model, prompt, DECODE)

        def theirs_prefill(n: int):
            llm.reset()
            llm.eval(prompt[:n])
            llamacpp_last_logits(llm)

        def theirs_decode():
            llamacpp_decode(llm, prompt, DECODE)

        cases = [(lambda n=n, f=f: f(n), n) for n in PROMPTS for f in (ours_prefill, theirs_prefill)]
        cases += [(ours_decode, DECODE), (theirs_decode, DECODE)]
        got = interleaved_rates(cases, rounds=3)
        names = [f"prefill {n}" for n in PROMPTS] + [f"decode {DECODE}"]
        for name, ours, theirs in zip(names, got[0::2], got[1::2]):
            print(
                f"{'LLaMA 110M ' + qtype + ' ' + name:36s} {ours:10.1f} {theirs:10.1f} {'tok/s':6s} "
                f"{ours / theirs:6.2f}x",
                flush=True,
            )


def log_prob(logits: np.ndarray, text: list[int]) -> float:
    """Summed log-probability of text[1:] given each row of logits (row i predicts token i + 1)."""
    x = logits[:-1].astype(np.float64)
    x -= x.max(-1, keepdims=True)
    lse = np.log(np.exp(x).sum(-1))
    return float((x[np.arange(len(text) - 1), text[1:]] - lse).sum())


def quantize_with_llamacpp(src: Path, dst: Path, qtype: str) -> None:
    """llama.cpp's own quantizer, every matrix in qtype (`pure`): the file the accuracy check compares holds the
    F32 file's weights as llama.cpp quantizes them, so the drift against F32 is the format's, not another model's."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = {"Q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, "Q4_K": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_S}[qtype]
    params.pure = True
    if llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params)) != 0:
        raise RuntimeError(f"llama.cpp could not quantize {src} to {qtype}")


def bench_accuracy(formats: list[str]) -> None:
    from fusegrad.models.llama import Llama

    text = np.random.default_rng(1).integers(0, LLAMA_SHAPE["vocab_size"], TEXT).tolist()
    print(
        f"{'format':8s} {'fusegrad':>14s} {'llama.cpp':>14s} {'fg/llama.cpp - 1':>17s} {'fg drift vs F32':>16s} "
        f"{'llama.cpp drift':>16s} {'fg token by token':>18s} {'its drift':>10s}"
    )
    with tempfile.TemporaryDirectory() as d:
        f32_path, ref = write_model(d, "F32")
        with torch.no_grad():
            hf = log_prob(ref(torch.tensor([text])).logits[0].float().numpy(), text)
        base: tuple[float, float] | None = None
        for qtype in ["F32"] + [f for f in formats if f != "F32"]:
            path = f32_path if qtype == "F32" else Path(d) / f"llama-{qtype}-llamacpp.gguf"
            if qtype != "F32":
                quantize_with_llamacpp(f32_path, path, qtype)
            model, _ = Llama.from_gguf(path, progress=False)
            model.reset()
            chunks = [model.forward(np.array(text[i : i + 128], np.int32), i).numpy() for i in range(0, TEXT, 128)]
            ours = log_prob(np.concatenate(chunks), text)
            model.reset()
            steps = [model.forward(np.array(text[i : i + 1], np.int32), i).numpy() for i in range(TEXT)]
            ours_steps = log_prob(np.concatenate(steps), text)
            llm = load_llamacpp(path, logits_all=True)
            llm.reset()
            llm.eval(text)
            theirs = log_prob(np.array(llm.scores[:TEXT], np.float32), text)
            del llm, model
            base = base or (ours, theirs)
            drift = f"{ours / base[0] - 1:16.2e} {theirs / base[1] - 1:16.2e}" if qtype != "F32" else " " * 33
            steps_drift = f"{ours_steps / base[0] - 1:10.2e}"
            print(
                f"{qtype:8s} {ours:14.4f} {theirs:14.4f} {ours / theirs - 1:17.2e} {drift} {ours_steps:18.4f} "
                f"{steps_drift}",
                flush=True,
            )
    print(f"transformers, F32 weights: {hf:.4f} (fusegrad F32 / transformers - 1 = {base[0] / hf - 1:.2e})")


def main() -> None:
    args = sys.argv[1:]
    formats = ["F32", "Q8_0", "Q4_K"]
    if "--formats" in args:
        i = args.index("--formats")
        formats = args[i + 1].split(",")
        del args[i : i + 2]
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        sys.exit("this bench needs llama-cpp-python: pip install llama-cpp-python (builds llama.cpp from source)")
    torch.set_num_threads(NUM_CPU_THREADS.value)
    print(f"threads: {NUM_CPU_THREADS.value} each side, machine load average {os.getloadavg()[0]:.1f}")
    cases = {
        "speed": bench_speed,
        "accuracy": bench_accuracy,
        "decode-cpu": lambda f: bench_cpu(f, prefill=False),
        "prefill-cpu": lambda f: bench_cpu(f, prefill=True),
    }
    for name in args or ["speed", "accuracy"]:
        if name not in cases:
            sys.exit(f"unknown case {name!r}; cases: {', '.join(cases)}")
        cases[name](formats)


if __name__ == "__main__":
    main()
