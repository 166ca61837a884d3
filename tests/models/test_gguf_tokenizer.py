"""Tokenizers from GGUF metadata: byte-level BPE against the tokenizers-library tokenizer the vocabulary was trained
as, SentencePiece against transformers' own reading of the same GGUF file; chat templates rendered from the file."""

import json

import gguf
import numpy as np
import pytest

pytest.importorskip("tokenizers", reason="the models extra installs tokenizers")

from fusegrad.models.gguf_tokenizer import PRE_TOKENIZER_SPLITS, GGUFTokenizer  # noqa: E402
from fusegrad.nn.state import gguf_load  # noqa: E402

TEXTS = [
    "The lazy fox, jumping!",
    "<|im_start|>user\nHi 🙂 there 999<|im_end|>",
    "  spaces   and\ttabs\n\nnewlines",
    "It's 2026; we're testing 12345 tokens.",
    "Ünïcödé",
]


def write(path, tokenizer_kv: dict) -> dict:
    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in tokenizer_kv.items():
        getattr(w, key)(value)
    w.add_tensor("unused", np.zeros(1, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return gguf_load(path)[0]


@pytest.mark.parametrize("pre", ["default", "llama-bpe", "qwen2"])
def test_bpe_matches_the_trained_tokenizer(tmp_path, pre):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    ref = Tokenizer(models.BPE(ignore_merges=pre == "llama-bpe"))
    ref.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRE_TOKENIZER_SPLITS[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    ref.decoder = decoders.ByteLevel()
    corpus = ["The quick brown fox jumps over the lazy dog.", "Hello, world! It's 2026 and we're testing 12345."] * 20
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    ref.train_from_iterator(corpus, trainer)
    model = json.loads(ref.to_str())["model"]
    tokens = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    kv = write(
        tmp_path / "t.gguf",
        {
            "add_tokenizer_model": "gpt2",
            "add_tokenizer_pre": pre,
            "add_token_list": tokens,
            "add_token_types": [3 if t.startswith("<|") else 1 for t in tokens],
            "add_token_merges": [" ".join(m) for m in model["merges"]],
            "add_eos_token_id": 1,
        },
    )
    tok = GGUFTokenizer(kv)
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids == ref.encode(text).ids, text
        assert tok.decode(ids) == text.replace("<|im_start|>", "").replace("<|im_end|>", "")
    assert tok.encode("<|im_end|>") == [1] and 1 in tok.stop_ids


def test_sentencepiece_matches_transformers(tmp_path):
    transformers = pytest.importorskip("transformers", reason="the test extra installs transformers")
    pieces = ["▁", "t", "h", "e", "a", "c", "s", "o", "n", "▁t", "he", "▁the", "at", "▁c", "▁cat", "▁s", "▁sat"]
    pieces += ["on", "▁on", "ca", "▁ca", "sa", "▁sa", "▁he"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    kv = write(
        tmp_path / "t.gguf",
        {
            "add_tokenizer_model": "llama",
            "add_token_list": tokens,
            "add_token_types": [2, 3, 3] + [6] * 256 + [1] * len(pieces),
            "add_token_scores": [0.0] * 259 + [-float(i) for i in range(len(pieces))],
            "add_bos_token_id": 1,
            "add_eos_token_id": 2,
            "add_unk_token_id": 0,
        },
    )
    tok = GGUFTokenizer(kv)
    ref = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file="t.gguf")
    for text in ["the cat sat on the hat", "Öl ünd 🙂", "he sat</s>on", "two  spaces  "]:
        ids = tok.encode(text)
        assert ids == ref.encode(text), (text, [tokens[i] for i in ids], ref.convert_ids_to_tokens(ref.encode(text)))
        assert tok.decode(ids) == text.replace("</s>", "")
    # a leading space still gets the dummy prefix, as in SentencePiece and llama.cpp (transformers skips it there)
    assert [tokens[i] for i in tok.encode(" the")] == ["<s>", "▁", "▁the"]


def test_chat_template_from_metadata():
    kv = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>", "▁"],
        "tokenizer.ggml.token_type": [2, 3, 3, 1],
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.chat_template": "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}"
        "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}",
    }
    tok = GGUFTokenizer(kv)
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}, {"role": "user", "content": "?"}]
    assert tok.apply_chat_template(msgs) == "<s>[user]hi[assistant]yo</s>[user]?[assistant]"
    kv["tokenizer.chat_template"] = "{{ raise_exception('no system role') }}"
    with pytest.raises(ValueError, match="no system role"):
        GGUFTokenizer(kv).apply_chat_template(msgs)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([7])
