"""Supervised warm-up: response-only token-mean cross-entropy through the trainer's machinery."""
import math

import pytest
import torch

from memagent.rl.algos import token_logprobs
from memagent.rl.distributed import DistInfo
from memagent.rl.sft import SFTConfig, encode_conversation, sft_step_grads, train_sft

from rl_helpers import tiny_model


def test_sft_loss_is_response_token_mean_and_split_invariant():
    model = tiny_model()
    rows = [([5, 6, 7], [8, 9]), ([3], [4, 4, 4]), ([1, 2], [10])]
    grads = []
    for micro in (3, 1, 2):
        model.zero_grad(set_to_none=True)
        m = sft_step_grads(model, rows, micro_batch_size=micro, pad_id=0, info=DistInfo())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    # loop reference: -sum of response-token log-probs / number of response tokens (6)
    total = 0.0
    for p, r in rows:
        logits = model(input_ids=torch.tensor([p + r])).logits[:, len(p) - 1 : -1]
        total -= token_logprobs(logits, torch.tensor([r])).sum().item()
    assert m["loss"] == pytest.approx(total / 6, abs=1e-12) and m["tokens"] == 6
    for g in grads[1:]:
        assert max((g[k] - grads[0][k]).abs().max().item() for k in g) < 1e-12


def test_encode_conversation_matches_backend(tmp_path):
    from memagent.backends.hf import TransformersBackend
    from memagent.backends.tiny import build_tokenizer

    tok = build_tokenizer(vocab_size=512)
    backend = TransformersBackend(tiny_model(vocab=len(tok), dtype=torch.float32), tok)
    p, r = encode_conversation(tok, "Question: what?", "\\boxed{blue}")
    assert p == backend.encode("Question: what?")
    assert r[-1] == tok.eos_token_id and tok.decode(r[:-1]) == "\\boxed{blue}"


def test_train_sft_learns_a_fixed_reply_and_checkpoints(tmp_path):
    from transformers import AutoModelForCausalLM

    model = tiny_model(dtype=torch.float32)
    rows = [{"prompt_ids": [i, i + 1, i + 2], "response_ids": [7, 11, 13]} for i in range(1, 9)]
    cfg = SFTConfig(out_dir=str(tmp_path / "sft"), epochs=30, batch_size=4, micro_batch_size=2, progress=False)
    cfg.optim.lr = 1e-2
    res = train_sft(cfg, rows, model, tokenizer=_Tok())
    losses = [r["loss"] for r in res.metrics]
    assert len(losses) == 60 and losses[-1] < 0.1 * losses[0] and res.metrics[-1]["token_accuracy"] == 1.0
    assert math.isclose(res.metrics[-1]["epoch"], 30.0)
    loaded = AutoModelForCausalLM.from_pretrained(res.checkpoint / "model")
    assert torch.equal(loaded.model.embed_tokens.weight, model.model.embed_tokens.weight)
    with pytest.raises(Exception, match="prompt_ids, response_ids"):
        train_sft(SFTConfig(out_dir=str(tmp_path / "bad")), [([1], [])], model, tokenizer=_Tok())


class _Tok:
    """The little a checkpoint needs from a tokenizer."""

    pad_token_id = 0
    eos_token_id = 1

    def save_pretrained(self, path):
        pass


def test_sft_gradient_scales_and_loss_is_reported_unscaled():
    model = tiny_model()
    rows = [([5, 6, 7], [8, 9]), ([3], [4, 4, 4])]
    out = []
    for scale in (1.0, 0.25):
        model.zero_grad(set_to_none=True)
        m = sft_step_grads(model, rows, micro_batch_size=2, pad_id=0, info=DistInfo(), scale=scale)
        out.append((m["loss"], {n: p.grad.clone() for n, p in model.named_parameters()}))
    assert out[0][0] == out[1][0]
    for n, g in out[0][1].items():
        assert torch.allclose(out[1][1][n], 0.25 * g, rtol=0, atol=1e-12), n


def test_train_sft_resumes_like_the_rl_trainer(tmp_path):
    """The recipe both trainers share: a run stopped at step 2 and resumed equals an uninterrupted one,
    record by record and weight by weight."""
    rows = [([i, i + 1], [7, 11, 13][: 1 + i % 3]) for i in range(1, 7)]
    timing = {"step_s"}

    def run(out, **kw):
        cfg = SFTConfig(out_dir=str(tmp_path / out), epochs=2, batch_size=3, micro_batch_size=2, progress=False,
                        save_every=2, **kw)
        cfg.optim.lr = 1e-2
        return cfg

    full = train_sft(run("a"), rows, tiny_model(), tokenizer=_Tok())
    stopped = train_sft(run("b"), rows, tiny_model(), tokenizer=_Tok(), callback=lambda step, m: step < 2)
    assert [r["step"] for r in stopped.metrics] == [1, 2]
    resumed = train_sft(run("b", resume=True), rows, tiny_model(), tokenizer=_Tok())
    assert [r["step"] for r in resumed.metrics] == [3, 4]
    for a, b in zip(full.metrics[2:], resumed.metrics):
        assert {k: v for k, v in a.items() if k not in timing} == {k: v for k, v in b.items() if k not in timing}
    for name, p in full.model.named_parameters():
        assert torch.equal(p, dict(resumed.model.named_parameters())[name]), name
