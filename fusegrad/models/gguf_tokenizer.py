"""The tokenizer and chat template stored in a GGUF file's metadata.

"gpt2" vocabularies (byte-level BPE with merges: llama 3, qwen) run on the Hugging Face `tokenizers` library, built
from the file's tokens, merges and the pre-tokenizer regex that `tokenizer.ggml.pre` names. "llama" vocabularies
(SentencePiece BPE: merge the adjacent pair whose merge has the highest score, bytes as <0xXX> tokens) are encoded
here. Control and user-defined tokens (chat markers such as <|im_start|>) are matched whole in the text."""

from __future__ import annotations

import heapq
import re
from typing import Any

# tokenizer.ggml.token_type values
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_CONTRACTIONS_WORDS = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|"""
_PUNCT_SPACES = r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
_LLAMA3_SPLIT = _CONTRACTIONS_WORDS + r"\p{N}{1,3}|" + _PUNCT_SPACES  # numbers in groups of up to 3 digits
_QWEN2_SPLIT = _CONTRACTIONS_WORDS + r"\p{N}|" + _PUNCT_SPACES  # single digits
PRE_TOKENIZER_SPLITS = {
    "default": _GPT2_SPLIT,
    "gpt-2": _GPT2_SPLIT,
    "gpt2": _GPT2_SPLIT,
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "qwen35": _QWEN2_SPLIT,
}


class GGUFTokenizer:
    def __init__(self, kv: dict[str, Any]):
        self.kind = kv.get("tokenizer.ggml.model")
        self.tokens: list[str] = list(kv.get("tokenizer.ggml.tokens", []))
        if not self.tokens:
            raise ValueError("GGUF metadata has no tokenizer.ggml.tokens: the file carries no tokenizer")
        self.types: list[int] = list(kv.get("tokenizer.ggml.token_type", [NORMAL] * len(self.tokens)))
        self.bos_id: int | None = kv.get("tokenizer.ggml.bos_token_id")
        self.eos_id: int | None = kv.get("tokenizer.ggml.eos_token_id")
        self.add_bos = bool(kv.get("tokenizer.ggml.add_bos_token", self.kind == "llama"))
        self.chat_template: str | None = kv.get("tokenizer.chat_template")
        self.ids = {t: i for i, t in enumerate(self.tokens)}
        self.specials = [t for t, ty in zip(self.tokens, self.types) if ty in (CONTROL, USER_DEFINED)]
        # end-of-turn tokens stop generation: the eos and the chat markers that end a turn
        ends = {"<|im_end|>", "<|eot_id|>", "<|end|>", "<|endoftext|>", "</s>", "<end_of_turn>", "<|eom_id|>"}
        self.stop_ids = {i for t, i in self.ids.items() if t in ends} | (
            {self.eos_id} if self.eos_id is not None else set()
        )
        if self.kind == "gpt2":
            self._hf = self._build_bpe(kv)
        elif self.kind == "llama":
            self.scores: list[float] = list(kv.get("tokenizer.ggml.scores", [0.0] * len(self.tokens)))
            self.unk_id = kv.get("tokenizer.ggml.unknown_token_id", self.ids.get("<unk>", 0))
            self.byte_ids = {
                int(t[3:5], 16): i
                for i, t in enumerate(self.tokens)
                if self.types[i] == BYTE or re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", t)
            }
            self._special_re = (
                re.compile("|".join(map(re.escape, sorted(self.specials, key=len, reverse=True))))
                if self.specials
                else None
            )
        else:
            raise ValueError(
                f"tokenizer.ggml.model {self.kind!r} is not supported; supported: gpt2 (BPE), llama (SentencePiece)"
            )

    # ------------------------------------------------------------------ byte-level BPE (tokenizers library)
    def _build_bpe(self, kv: dict[str, Any]) -> Any:
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

        pre = kv.get("tokenizer.ggml.pre", "default")
        if pre not in PRE_TOKENIZER_SPLITS:
            raise ValueError(f"tokenizer.ggml.pre {pre!r} is not supported; supported: {sorted(PRE_TOKENIZER_SPLITS)}")
        merges = [tuple(m.split(" ", 1)) for m in kv.get("tokenizer.ggml.merges", [])]
        tok = Tokenizer(
            models.BPE(vocab=dict(self.ids), merges=merges, fuse_unk=False, ignore_merges=pre.startswith("llama"))
        )
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(PRE_TOKENIZER_SPLITS[pre]), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in self.specials])
        return tok

    # ------------------------------------------------------------------ SentencePiece BPE
    def _spm_piece(self, text: str) -> list[int]:
        """Merge characters by best score until no adjacent pair is a token; unknown pieces fall back to bytes."""
        symbols = list(text)
        if not symbols:
            return []
        prev, nxt = list(range(-1, len(symbols) - 1)), list(range(1, len(symbols) + 1))
        heap: list[tuple[float, int, int, str]] = []

        def push(i: int) -> None:
            j = nxt[i]
            if j < len(symbols):
                merged = symbols[i] + symbols[j]
                if (tid := self.ids.get(merged)) is not None:
                    heapq.heappush(heap, (-self.scores[tid], i, j, merged))

        for i in range(len(symbols) - 1):
            push(i)
        while heap:
            _, i, j, merged = heapq.heappop(heap)
            if not symbols[i] or not symbols[j] or nxt[i] != j or symbols[i] + symbols[j] != merged:
                continue  # stale: one side merged since this pair was queued
            symbols[i], symbols[j] = merged, ""
            nxt[i] = nxt[j]
            if nxt[j] < len(symbols):
                prev[nxt[j]] = i
            if prev[i] >= 0:
                push(prev[i])
            push(i)
        out = []
        for s in symbols:
            if not s:
                continue
            if (tid := self.ids.get(s)) is not None:
                out.append(tid)
            else:
                out.extend(self.byte_ids.get(b, self.unk_id) for b in s.encode())
        return out

    def _spm_encode(self, text: str) -> list[int]:
        out: list[int] = []
        parts = self._special_re.split(text) if self._special_re else [text]
        found = self._special_re.findall(text) if self._special_re else []
        for k, part in enumerate(parts):
            if part:
                # SentencePiece marks spaces with U+2581 and prefixes a space to the text (not after a special token)
                prefix = "\u2581" if k == 0 else ""
                out.extend(self._spm_piece(prefix + part.replace(" ", "\u2581")))
            if k < len(found):
                out.append(self.ids[found[k]])
        return out

    def _spm_decode(self, ids: list[int]) -> str:
        pieces: list[bytes] = []
        for i in ids:
            t, ty = self.tokens[i], self.types[i]
            if ty == BYTE or re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", t):
                pieces.append(bytes([int(t[3:5], 16)]))
            elif ty == CONTROL:
                continue
            else:
                pieces.append(t.replace("\u2581", " ").encode())
        text = b"".join(pieces).decode("utf-8", errors="replace")
        return text[1:] if text.startswith(" ") else text

    # ------------------------------------------------------------------ public
    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        ids = self._hf.encode(text, add_special_tokens=False).ids if self.kind == "gpt2" else self._spm_encode(text)
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            ids = [self.bos_id] + ids
        return ids

    def decode(self, ids: list[int]) -> str:
        bad = [i for i in ids if not 0 <= i < len(self.tokens)]
        if bad:
            raise ValueError(f"token ids {bad[:8]} are outside the vocabulary of {len(self.tokens)}")
        if self.kind == "gpt2":
            return self._hf.decode(list(ids), skip_special_tokens=True)
        return self._spm_decode(list(ids))

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The prompt text of a conversation, rendered from the file's Jinja chat template in a sandbox."""
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        template = self.chat_template or _CHATML
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

        def raise_exception(message: str) -> None:
            raise ValueError(f"chat template: {message}")

        env.globals["raise_exception"] = raise_exception
        bos = self.tokens[self.bos_id] if self.bos_id is not None else ""
        eos = self.tokens[self.eos_id] if self.eos_id is not None else ""
        return env.from_string(template).render(
            messages=messages, add_generation_prompt=add_generation_prompt, bos_token=bos, eos_token=eos
        )


# used when a file has no template: ChatML, the most common format
_CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
