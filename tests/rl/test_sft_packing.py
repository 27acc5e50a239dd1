"""SFT with padding-free micro-batches (SFTConfig.micro_batch_tokens > 0): the padded path's numbers."""
import pytest
import torch

import memagent.rl.objectives as objectives
from memagent.config import ConfigError
from memagent.rl.distributed import DistInfo
from memagent.rl.sft import SFTConfig, sft_step_grads, train_sft

from rl_helpers import tiny_model

# 6 rows of 3-9 tokens (prompt + response): a budget of 12 tokens packs them as
# [0, 1] (5 + 7 = 12), [2, 3] (4 + 6), [4] (9), [5] (8 alone: 9 + 8 > 12)
ROWS = [([5, 6, 7], [8, 9]), ([3], [4, 4, 4, 2, 2, 9]), ([1, 2], [10, 11]), ([9, 8, 7, 6, 5], [1]),
        ([2, 3, 4, 5], [6, 7, 8, 9, 10]), ([12, 13], [14, 15, 16, 17, 18, 19])]


@pytest.fixture
def layouts(monkeypatch):
    """Records, for each micro-batch accumulate_gradients packs, (number of rows, padding-free?)."""
    seen = []
    real = objectives.pack_batch

    def spy(prompts, responses, pad_id, flat):
        seen.append((len(prompts), flat))
        return real(prompts, responses, pad_id, flat)

    monkeypatch.setattr(objectives, "pack_batch", spy)
    return seen


def _grads(model, **kw):
    model.zero_grad(set_to_none=True)
    m = sft_step_grads(model, ROWS, pad_id=0, info=DistInfo(), **kw)
    return m, {n: p.grad.clone() for n, p in model.named_parameters()}


def test_packed_sft_step_equals_padded(layouts):
    model = tiny_model()
    padded, g_pad = _grads(model, micro_batch_size=4)
    assert layouts == [(4, False), (2, False)]
    layouts.clear()
    packed, g_flat = _grads(model, micro_batch_size=4, micro_batch_tokens=12)
    assert layouts == [(2, True), (2, True), (1, True), (1, True)]
    assert packed["tokens"] == padded["tokens"] == 2 + 6 + 2 + 1 + 5 + 6
    assert abs(packed["loss"] - padded["loss"]) <= 1e-6
    assert packed["token_accuracy"] == padded["token_accuracy"]
    assert max((g_flat[k] - g_pad[k]).abs().max().item() for k in g_pad) <= 1e-6


def _run(tmp_path, name, tokens):
    cfg = SFTConfig(out_dir=str(tmp_path / name), epochs=1.5, batch_size=4, micro_batch_size=2,
                    micro_batch_tokens=tokens, progress=False, save=False)
    cfg.optim.lr = 1e-2
    return train_sft(cfg, ROWS, tiny_model(), tokenizer=_Tok())


def test_train_sft_packed_follows_the_padded_run(tmp_path, layouts):
    padded = _run(tmp_path, "padded", 0)
    assert layouts and not any(flat for _, flat in layouts)
    layouts.clear()
    packed = _run(tmp_path, "packed", 16)
    assert layouts and all(flat for _, flat in layouts) and max(n for n, _ in layouts) > 2
    assert len(packed.metrics) == len(padded.metrics) == 3  # ceil(1.5 * 6 / 4) steps
    for a, b in zip(padded.metrics, packed.metrics):
        assert abs(a["loss"] - b["loss"]) <= 1e-6 and a["tokens"] == b["tokens"]
    ref = dict(padded.model.named_parameters())
    for name, p in packed.model.named_parameters():
        assert (p - ref[name]).abs().max().item() <= 1e-6, name
    assert any((p - q).abs().max().item() > 1e-3 for p, q in zip(tiny_model().parameters(), packed.model.parameters()))
    from memagent.rl.varlen import is_varlen

    assert is_varlen(packed.model) and not is_varlen(padded.model)  # packing switched sdpa to per-row attention


def test_micro_batch_tokens_must_not_be_negative():
    with pytest.raises(ConfigError, match="micro_batch_tokens must be >= 0"):
        SFTConfig(micro_batch_tokens=-1)


class _Tok:
    pad_token_id = 0
    eos_token_id = 1

    def save_pretrained(self, path):
        pass
