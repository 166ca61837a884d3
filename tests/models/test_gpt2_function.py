"""GPT-2's blocks are @functions: an N-layer forward traces each block part once and compiles one block's kernels."""

import numpy as np
from fusegrad import GlobalCounters, Tensor
from fusegrad.engine import realize
from fusegrad.models import gpt2
from fusegrad.models.gpt2 import GPT2, GPT2Config
from fusegrad.schedule.cache import clear_schedule_cache

PARTS = ("_qkv", "_attention_residual", "_mlp_residual")


def small(n_layer: int) -> GPT2:
    Tensor.manual_seed(0)
    return GPT2(GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=n_layer, n_head=4))


def forward_compiles(n_layer: int) -> int:
    """Kernels compiled by one forward of an n_layer model, from empty program and schedule caches."""
    realize._runners.clear()
    clear_schedule_cache()
    model = small(n_layer)
    before = GlobalCounters.compile_count
    model.forward(np.arange(7), 0).numpy()
    return GlobalCounters.compile_count - before


def test_a_12_layer_forward_compiles_the_kernels_of_a_1_layer_forward():
    one, twelve = forward_compiles(1), forward_compiles(12)
    assert one == twelve and one > 0


def test_each_block_part_is_traced_once_for_all_layers_and_changes_no_logit(monkeypatch):
    for name in PARTS:
        getattr(gpt2, name).traces.clear()
    ids = np.arange(5) * 7 % 64
    traced = small(5).forward(ids, 0).numpy()
    assert [len(getattr(gpt2, name).traces) for name in PARTS] == [1, 1, 1]
    for name in PARTS:
        monkeypatch.setattr(gpt2, name, getattr(gpt2, name).fxn)
    np.testing.assert_allclose(traced, small(5).forward(ids, 0).numpy(), atol=0, rtol=0)
