"""Objectives by name, several objectives in one accumulation, the rollout totals by name."""
import pytest
import torch

from memagent.config import ConfigError
from memagent.rl.config import LossConfig
from memagent.rl.distributed import DistInfo
from memagent.rl.objectives import DAPO, SFT, get_objective

from rl_helpers import accumulate, dapo, synthetic_minibatch, tiny_model

INFO = DistInfo()


def test_objectives_by_name_take_their_settings_from_the_config():
    obj = get_objective("dapo", loss=LossConfig(clip_high=0.25, kl_coef=0.0), horizon=8, temperature=0.7)
    assert obj == DAPO(0.2, 0.25, 3.0, "token-mean", 0.0, "k3", 8, 0.7)
    assert get_objective("sft") == SFT() and SFT().agg == "token-mean"
    with pytest.raises(ConfigError, match="unknown objective 'ppo'; choose one of: dapo, sft"):
        get_objective("ppo")


def test_two_objectives_in_one_accumulation_sum_their_weighted_gradients():
    """[(dapo, 1), (sft, 0.5)] leaves grad(dapo) + 0.5 grad(sft), for any micro-batch size; each term
    reports its own metrics."""
    model = tiny_model()
    mb = synthetic_minibatch(seed=3, n_samples=3)
    rows = [([5, 6, 7], [8, 9]), ([3], [4, 4, 4]), ([1, 2], [10])]

    def grads():
        g = {n: p.grad.clone() for n, p in model.named_parameters()}
        model.zero_grad(set_to_none=True)
        return g

    [m_rl] = accumulate(model, mb, dapo("token-mean"), 2, INFO)
    g_rl = grads()
    _, m_sft = accumulate(model, mb, dapo("token-mean"), 5, INFO, rows, 1.0)
    g_sft = {n: g - g_rl[n] for n, g in grads().items()}  # the sft term alone, at weight 1
    for micro in (1, 3):
        m_both, m_half = accumulate(model, mb, dapo("token-mean"), micro, INFO, rows, 0.5)
        got = grads()
        diff = max((got[n] - (g_rl[n] + 0.5 * g_sft[n])).abs().max().item() for n in got)
        assert diff < 1e-12, (micro, diff)
        assert m_both["loss"] == pytest.approx(m_rl["loss"], abs=1e-12)
        assert m_half["loss"] == pytest.approx(m_sft["loss"], abs=1e-12)  # reported unweighted
        assert m_half["tokens"] == 6.0 and set(m_half) == {"loss", "token_accuracy", "tokens"}


def test_rollout_totals_are_named_sums():
    from memagent.rl.rollout import RolloutBatch, RolloutTally

    def batch(rewards, rows, tokens, seconds):
        return RolloutBatch([], [], None, torch.zeros(rows, dtype=torch.long), torch.zeros(rows, dtype=torch.bool),
                            torch.tensor(rewards), torch.arange(len(rewards)), [None] * len(rewards), tokens, seconds)

    tally = RolloutTally()
    tally.add(batch([1.0, 0.0, 0.5], 0, 12, 2.0))
    tally.add(batch([1.0], 0, 3, 1.5))
    assert tally == RolloutTally(reward=2.5, correct=2.0, samples=4.0, rows=0.0, tokens=15.0, seconds=3.5)
    assert tally.reduced(INFO) == tally  # one process: the sums themselves
