"""A BERT-style encoder from transformers (random weights, small config) exported to ONNX with torch.onnx.export."""

import torch
import transformers


class _Encoder(torch.nn.Module):
    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids, mask):
        return self.model(input_ids=ids, attention_mask=mask).last_hidden_state


def export_bert(path: str, hidden: int = 128, layers: int = 2, seq: int = 32, vocab: int = 1000) -> None:
    cfg = transformers.BertConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=4 * hidden,
        max_position_embeddings=seq,
    )
    torch.manual_seed(0)
    model = _Encoder(transformers.BertModel(cfg).eval())
    ids, mask = torch.zeros(1, seq, dtype=torch.int64), torch.ones(1, seq, dtype=torch.int64)
    torch.onnx.export(
        model,
        (ids, mask),
        path,
        input_names=["input_ids", "attention_mask"],
        output_names=["last_hidden_state"],
        opset_version=17,
        dynamo=False,
    )
