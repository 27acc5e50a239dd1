"""Gradient accumulation: one mini-batch's gradient does not depend on the micro-batch split or the ranks."""
import math

import pytest
import torch

from memagent.rl.algos import AGG_MODES, kl_penalty, policy_loss, token_logprobs
from memagent.rl.distributed import DistInfo
from memagent.rl.packing import pack_rows, response_logits, rows_logprobs

from rl_helpers import accumulate, dapo, synthetic_minibatch, tiny_model, torchrun

INFO = DistInfo()


def grads_of(model, mb, objective, micro):
    model.zero_grad(set_to_none=True)
    [metrics] = accumulate(model, mb, objective, micro, INFO)
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, metrics


def test_pack_rows_layout_and_logprobs_match_unpadded():
    model = tiny_model()
    prompts, responses = [[5, 6, 7], [9]], [[1, 2], [3, 4, 8]]
    packed = pack_rows(prompts, responses, pad_id=0)
    assert packed.input_ids.tolist() == [[5, 6, 7, 1, 2, 0], [0, 0, 9, 3, 4, 8]]
    assert packed.position_ids.tolist()[1][2:] == [0, 1, 2, 3]
    assert packed.response_mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    lp = rows_logprobs(model, prompts, responses, pad_id=0, micro_batch_size=2, info=INFO)
    for p, r, got in zip(prompts, responses, lp):  # one row at a time, no padding at all
        ids = torch.tensor([p + r])
        logits = model(input_ids=ids).logits[:, len(p) - 1 : -1]
        want = token_logprobs(logits, torch.tensor([r]))[0]
        assert torch.allclose(got, want, atol=1e-10)


@pytest.mark.parametrize("agg", AGG_MODES)
def test_micro_batch_split_invariance(agg):
    model = tiny_model()
    mb = synthetic_minibatch(seed=1, n_samples=4)
    settings = dapo(agg, kl_coef=0.1, horizon=8)
    n = len(mb.response_ids)
    ref, m_ref = grads_of(model, mb, settings, micro=n)
    for micro in (1, 2, 3):
        got, m = grads_of(model, mb, settings, micro=micro)
        assert got.keys() == ref.keys() and len(got) == sum(1 for _ in model.parameters())
        diff = max((got[k] - ref[k]).abs().max().item() for k in ref)
        print(f"micro-batch split {agg} micro={micro}: max abs grad diff {diff:.2e}")
        assert diff < 1e-12, (micro, diff)
        assert m["loss"] == pytest.approx(m_ref["loss"], abs=1e-12)
        assert m["tokens"] == sum(len(r) for r in mb.response_ids)


def test_gradient_equals_direct_loss_gradient():
    """accumulate_gradients' gradient equals autograd of the plain (unsplit) formula."""
    model = tiny_model()
    mb = synthetic_minibatch(seed=2, n_samples=3)
    settings = dapo("token-mean", kl_coef=0.05, horizon=None)
    got, metrics = grads_of(model, mb, settings, micro=2)
    model.zero_grad(set_to_none=True)
    total, n_tok = 0.0, sum(len(r) for r in mb.response_ids)
    for n in range(len(mb.response_ids)):  # loop reference: row by row, token-mean over all rows
        p, r = mb.prompt_ids[n], mb.response_ids[n]
        logits = model(input_ids=torch.tensor([p + r])).logits[:, len(p) - 1 : -1]
        lp = token_logprobs(logits, torch.tensor([r]))
        loss_sum, _ = policy_loss(lp, mb.old_logprobs[n][None], mb.advantages[n : n + 1], torch.ones_like(lp),
                                  0.2, 0.28, 3.0, "seq-mean-token-sum")  # one row: its token sum
        kl_sum = kl_penalty(lp, mb.ref_logprobs[n][None], "k3").sum()
        total = total + (loss_sum + 0.05 * kl_sum) / n_tok
    total.backward()
    for name, p in model.named_parameters():
        assert torch.allclose(got[name], p.grad, atol=1e-12), name
    assert metrics["loss"] == pytest.approx(total.item(), abs=1e-12)
    assert 0 <= metrics["clip_frac"] <= 1 and metrics["ratio_min"] <= metrics["ratio_max"]
    assert metrics["entropy"] > 0 and math.isfinite(metrics["kl"])


@pytest.mark.slow
def test_two_process_gradient_equals_one_process(tmp_path):
    """1 process vs 2 under torchrun (gloo), with DDP and with FSDP2, two aggregation modes."""
    from safetensors.torch import load_file

    aggs = ["token-mean", "sample-mean"]
    torchrun("dist_grad_script.py", tmp_path, *aggs)
    model = tiny_model()
    mb = synthetic_minibatch(seed=1, n_samples=4)
    for agg in aggs:
        want, m = grads_of(model, mb, dapo(agg, kl_coef=0.1, horizon=8), micro=3)
        for strategy in ("ddp", "fsdp"):
            got = load_file(tmp_path / f"grads_{agg}_{strategy}.safetensors")
            assert got.pop("__loss__").item() == pytest.approx(m["loss"], abs=1e-12)
            assert got.keys() == want.keys()
            diff = max((got[k] - want[k]).abs().max().item() for k in want)
            print(f"1 vs 2 processes, {agg}, {strategy}: max abs grad diff {diff:.2e}")
            assert diff < 1e-12, (agg, strategy, diff)
    # the auxiliary supervised loss (loss.sft_coef) added to a token-mean policy gradient: one process, all rows
    from dist_grad_script import aux_rows

    model.zero_grad(set_to_none=True)
    _, aux = accumulate(model, mb, dapo("token-mean", kl_coef=0.1, horizon=8), 3, INFO, aux_rows(mb), 3.0)
    for strategy in ("ddp", "fsdp"):
        got = load_file(tmp_path / f"grads_aux_{strategy}.safetensors")
        assert got.pop("__loss__").item() == pytest.approx(aux["loss"], abs=1e-12)
        diff = max((got[k] - p.grad).abs().max().item() for k, p in model.named_parameters())
        print(f"1 vs 2 processes, policy gradient + auxiliary loss, {strategy}: max abs grad diff {diff:.2e}")
        assert diff < 1e-12, (strategy, diff)


def test_response_logits_for_a_model_without_optional_arguments():
    """An architecture whose forward lacks logits_to_keep/position_ids gets the same log-probs
    when its positions are plain (no left padding)."""
    model = tiny_model()

    class Plain(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask=None):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask)

    packed = pack_rows([[5, 6, 7]], [[1, 2]], pad_id=0)
    assert torch.allclose(response_logits(Plain(model), packed), response_logits(model, packed), atol=1e-12)
