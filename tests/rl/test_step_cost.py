"""The RL step's two exact savings (issue 44): rows whose advantage is 0 left out of the forward and backward
(update.skip_zero_advantage, with no KL term), and the old log-probs taken from the loss forward itself when the policy
has not moved since the rollout (update.old_logprobs=policy). Each gives the gradient it saves work on: bit for bit
where the micro-batches hold one row, within float rounding otherwise."""
import dataclasses

import pytest
import torch

from memagent.rl.distributed import DistInfo
from memagent.rl.objectives import Term, accumulate_gradients
from memagent.rl.packing import rows_logprobs

from rl_helpers import dapo, synthetic_minibatch, tiny_model

INFO = DistInfo()


def _grads(model, terms, micro):
    model.zero_grad(set_to_none=True)
    [metrics] = accumulate_gradients(model, terms, micro_batch_size=micro, pad_id=0, info=INFO)
    return {n: p.grad.clone() for n, p in model.named_parameters()}, metrics


def _with_zero_advantages(mb, samples=(0, 2)):
    adv = mb.advantages.clone()
    for s in samples:
        adv[mb.sample_index == s] = 0.0
    return dataclasses.replace(mb, advantages=adv, ref_logprobs=None)


@pytest.mark.parametrize("micro", [1, 3])
def test_skipping_zero_advantage_rows_gives_the_same_gradient(micro):
    model = tiny_model()
    mb = _with_zero_advantages(synthetic_minibatch(seed=5, n_samples=4, kl=False))
    skip = mb.advantages == 0
    assert 0 < int(skip.sum()) < mb.num_rows
    obj = dapo("token-mean", kl_coef=0.0)
    full, m_full = _grads(model, [Term(obj, 1.0, mb)], micro)
    calls = []
    hook = model.register_forward_hook(lambda mod, args, out: calls.append(1))
    part, m_part = _grads(model, [Term(obj, 1.0, mb, skip=skip)], micro)
    hook.remove()
    for name in full:
        if micro == 1:  # the same rows, one at a time: the same sums in the same order
            assert torch.equal(full[name], part[name]), name
        else:
            assert torch.allclose(full[name], part[name], atol=1e-12, rtol=0), name
    assert m_part["pg_loss"] == (m_full["pg_loss"] if micro == 1 else pytest.approx(m_full["pg_loss"], abs=1e-12))
    kept = mb.num_rows - int(skip.sum())
    assert len(calls) == (kept if micro == 1 else -(-kept // micro))  # the skipped rows never ran


def test_all_rows_skipped_still_leave_zero_gradients_for_the_optimiser():
    model = tiny_model()
    mb = _with_zero_advantages(synthetic_minibatch(seed=5, n_samples=3, kl=False), samples=(0, 1, 2))
    grads, metrics = _grads(model, [Term(dapo("token-mean", kl_coef=0.0), 1.0, mb, skip=mb.advantages == 0)], 2)
    assert all(g is not None and torch.count_nonzero(g) == 0 for g in grads.values())
    assert metrics["pg_loss"] == 0.0 and metrics["ratio_min"] == metrics["ratio_max"] == 1.0


def test_on_policy_old_logprobs_from_the_loss_forward_match_a_recompute():
    model = tiny_model()
    mb = dataclasses.replace(synthetic_minibatch(seed=7, n_samples=4, kl=False), ref_logprobs=None)
    obj = dapo("token-mean", kl_coef=0.0)
    old = rows_logprobs(model, mb.prompt_ids, mb.response_ids, pad_id=0, micro_batch_size=1, info=INFO)
    recomputed, m_old = _grads(model, [Term(obj, 1.0, dataclasses.replace(mb, old_logprobs=old))], 1)
    own, m_own = _grads(model, [Term(obj, 1.0, dataclasses.replace(mb, old_logprobs=None))], 1)
    assert m_own["ratio_min"] == m_own["ratio_max"] == 1.0  # exp(lp - lp.detach()): 1 exactly
    assert m_old["ratio_min"] == pytest.approx(1.0, abs=1e-12) and m_old["ratio_max"] == pytest.approx(1.0, abs=1e-12)
    assert m_own["pg_loss"] == pytest.approx(m_old["pg_loss"], abs=1e-12)
    for name in own:
        assert torch.allclose(own[name], recomputed[name], atol=1e-12, rtol=0), name


def test_the_trainer_with_both_savings_trains_the_same_weights(tmp_path):
    """Two Multi-Conv DAPO steps on the tiny model: with both savings on, the weights equal the plain run's within
    float rounding (groups of equal rewards and one optimiser step a batch: both savings apply)."""
    from memagent.backends.tiny import build_tokenizer
    from memagent.rl.trainer import train
    from test_rl_trainer import fresh_model, samples, small_config, symbol_reward

    tok = build_tokenizer()

    def reward(prediction, golds):  # the questions of odd keys are never rewarded: their groups' advantages are 0
        return 0.0 if int(golds[0]) % 2 else symbol_reward(prediction, golds)

    def run(out, *extra):
        cfg = small_config(out, "total_steps=2", "loss.kl_coef=0", "update.mini_batch_size=4",
                           "update.micro_batch_size=1", *extra)
        result = train(cfg, samples(), reward, model=fresh_model(tok), tokenizer=tok)
        return {n: p.detach().clone() for n, p in result.model.named_parameters()}, result.metrics

    plain, m_plain = run(tmp_path / "plain")
    fast, m_fast = run(tmp_path / "fast", "update.skip_zero_advantage=true", "update.old_logprobs=policy")
    assert [m["reward"] for m in m_plain] == [m["reward"] for m in m_fast]  # the same rollouts
    assert sum(m["skipped_rows"] for m in m_fast) > 0 and "skipped_rows" not in m_plain[0]  # both savings applied
    for name in plain:
        assert torch.allclose(plain[name], fast[name], atol=1e-6, rtol=1e-5), name
