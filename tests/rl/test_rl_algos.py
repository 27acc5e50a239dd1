"""memagent.rl.algos against hand-worked numbers and plain-loop references."""
import math
import random

import pytest
import torch

from memagent.rl import algos
from memagent.rl.algos import (
    AGG_MODES,
    UnknownNameError,
    agg_loss,
    broadcast_advantages,
    group_advantages,
    informative_groups,
    kl_penalty,
    loss_denominator,
    policy_loss,
    row_loss_weights,
)

CLIPS = (0.2, 0.28, 3.0)  # clip_low, clip_high, clip_c: the paper's (LossConfig's defaults)

# -- plain-loop references ----------------------------------------------------------------


def loop_group_advantages(rewards, groups, norm_by_std=False, eps=1e-6):
    out = []
    for r, g in zip(rewards, groups):
        members = [rr for rr, gg in zip(rewards, groups) if gg == g]
        mean = sum(members) / len(members)
        a = r - mean
        if norm_by_std:
            std = math.sqrt(sum((m - mean) ** 2 for m in members) / (len(members) - 1)) if len(members) > 1 else 1.0
            a = a / (std + eps)
        out.append(a)
    return out


def loop_token_loss(lp, olp, a, clip_low, clip_high, clip_c):
    r = math.exp(max(-20.0, min(20.0, lp - olp)))
    l1 = -a * r
    l2 = -a * min(max(r, 1 - clip_low), 1 + clip_high)
    l = max(l1, l2)
    if a < 0:
        l = min(l, -a * clip_c)
    return l


def loop_aggregate(per_token, lengths, agg, samples, horizon):
    """per_token: list of rows (lists of the real tokens' values)."""
    if agg == "token-mean":
        return sum(sum(r) for r in per_token) / sum(lengths)
    if agg == "seq-mean-token-mean":
        return sum(sum(r) / len(r) for r in per_token) / len(per_token)
    if agg == "seq-mean-token-sum":
        return sum(sum(r) for r in per_token) / len(per_token)
    if agg == "seq-mean-token-sum-norm":
        return sum(sum(r) / horizon for r in per_token) / len(per_token)
    assert agg == "sample-mean"
    by_sample = {}
    for r, s in zip(per_token, samples):
        by_sample.setdefault(s, []).extend(r)
    return sum(sum(v) / len(v) for v in by_sample.values()) / len(by_sample)


def loop_policy_loss(lp, olp, adv, lengths, agg, samples, horizon, clip_low=0.2, clip_high=0.28, clip_c=3.0):
    per_token = [[loop_token_loss(lp[n][t], olp[n][t], adv[n], clip_low, clip_high, clip_c) for t in range(lengths[n])]
                 for n in range(len(lengths))]
    return loop_aggregate(per_token, lengths, agg, samples, horizon)


def random_batch(seed, n_rows=7, width=6, n_samples=3):
    g = torch.Generator().manual_seed(seed)
    lengths = [int(torch.randint(1, width + 1, (1,), generator=g)) for _ in range(n_rows)]
    mask = torch.zeros(n_rows, width)
    for n, L in enumerate(lengths):
        mask[n, :L] = 1
    logp = -torch.rand(n_rows, width, generator=g, dtype=torch.float64) * 3
    old = logp + torch.randn(n_rows, width, generator=g, dtype=torch.float64) * 0.6
    adv = torch.randn(n_rows, generator=g, dtype=torch.float64)
    samples = torch.tensor([n % n_samples for n in range(n_rows)])
    return logp, old, adv, mask.double(), lengths, samples


# -- group advantages -----------------------------------------------------------------------


def test_group_advantages_hand_numbers():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    g = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    assert torch.allclose(group_advantages(r, g), torch.tensor([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]))
    # unbiased std of group 0 = sqrt(1/3); 0.5 / 0.57735 = 0.866025
    a = group_advantages(r, g, norm_by_std=True, eps=0.0)
    assert torch.allclose(a[:4], torch.tensor([0.866025, -0.866025, -0.866025, 0.866025]), atol=1e-6)
    assert torch.equal(a[4:], torch.zeros(4))
    # group ids need not be contiguous or sorted
    assert torch.allclose(group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), torch.tensor([7, 3, 7, 3])),
                          torch.tensor([0.5, 0.0, -0.5, 0.0]))


@pytest.mark.parametrize("norm", [False, True])
def test_group_advantages_matches_loop(norm):
    rng = random.Random(0)
    rewards = [rng.choice([0.0, 0.5, 1.0]) for _ in range(40)]
    groups = [rng.randrange(6) for _ in range(40)]
    got = group_advantages(torch.tensor(rewards, dtype=torch.float64), torch.tensor(groups), norm_by_std=norm)
    want = loop_group_advantages(rewards, groups, norm)
    assert torch.allclose(got, torch.tensor(want, dtype=torch.float64), atol=1e-12)


def test_group_advantages_shape_error():
    with pytest.raises(ValueError, match="must both be"):
        group_advantages(torch.zeros(3), torch.zeros(4, dtype=torch.long))


# -- broadcast --------------------------------------------------------------------------------


def test_broadcast_differing_conversation_counts():
    adv = torch.tensor([0.5, -0.25, 0.0, 1.5])
    counts = [1, 4, 2, 7]  # conversations per sample differ within the batch
    index = torch.tensor([s for s, c in enumerate(counts) for _ in range(c)])
    rows = broadcast_advantages(adv, index)
    assert rows.shape == (sum(counts),)
    pos = 0
    for s, c in enumerate(counts):  # loop reference: every row of sample s carries adv[s]
        for _ in range(c):
            assert rows[pos] == adv[s]
            pos += 1
    with pytest.raises(ValueError, match="sample_index must lie"):
        broadcast_advantages(adv, torch.tensor([0, 4]))


# -- dynamic sampling -------------------------------------------------------------------------


def test_informative_groups_keeps_exactly_unequal_groups():
    r = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.0])
    g = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3, 4])
    assert informative_groups(r, g).tolist() == [False, False, False, False, True, True, False, False, False]
    rng = random.Random(1)
    rewards = [rng.choice([0.0, 1.0]) for _ in range(60)]
    groups = [i // 4 for i in range(60)]
    got = informative_groups(torch.tensor(rewards), torch.tensor(groups)).tolist()
    want = [len({rr for rr, gg in zip(rewards, groups) if gg == g}) > 1 for g in groups]
    assert got == want


# -- policy loss ------------------------------------------------------------------------------


def hand_batch():
    # row 0: A = +1, ratios 1.5 (clipped to 1.28) and 0.5; row 1: A = -1, ratios 0.5 (clipped
    # up to 0.8), 5.0 (dual-clipped to 3) and 2.0; row 2: A = +1, ratio 1.0.
    ratios = [[1.5, 0.5, 1.0], [0.5, 5.0, 2.0], [1.0, 1.0, 1.0]]
    mask = torch.tensor([[1.0, 1, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.float64)
    old = torch.full((3, 3), -1.0, dtype=torch.float64)
    logp = old + torch.log(torch.tensor(ratios, dtype=torch.float64))
    adv = torch.tensor([1.0, -1.0, 1.0], dtype=torch.float64)
    return logp, old, adv, mask
    # token losses: row 0 [-1.28, -0.5], row 1 [0.8, 3.0, 2.0], row 2 [-1.0]


@pytest.mark.parametrize("agg,samples,want", [
    ("token-mean", [0, 1, 2], (-1.28 - 0.5 + 0.8 + 3.0 + 2.0 - 1.0) / 6),
    ("seq-mean-token-mean", [0, 1, 2], ((-1.78 / 2) + (5.8 / 3) + (-1.0)) / 3),
    ("seq-mean-token-sum", [0, 1, 2], (-1.78 + 5.8 - 1.0) / 3),
    ("seq-mean-token-sum-norm", [0, 1, 2], (-1.78 + 5.8 - 1.0) / 3 / 3),
    ("sample-mean", [0, 1, 0], ((-1.78 - 1.0) / 3 + 5.8 / 3) / 2),
    ("sample-mean", [0, 0, 0], (-1.28 - 0.5 + 0.8 + 3.0 + 2.0 - 1.0) / 6),
])
def test_policy_loss_hand_numbers(agg, samples, want):
    logp, old, adv, mask = hand_batch()
    loss, m = policy_loss(logp, old, adv, mask, 0.2, 0.28, 3.0, agg, sample_index=torch.tensor(samples))
    assert loss.item() == pytest.approx(want, abs=1e-12)
    assert m["clip_frac_high"].item() == pytest.approx(1 / 6)
    assert m["clip_frac_low"].item() == pytest.approx(1 / 6)
    assert m["clip_frac"].item() == pytest.approx(2 / 6)
    assert m["dual_clip_frac"].item() == pytest.approx(1 / 6)
    assert m["ratio_mean"].item() == pytest.approx((1.5 + 0.5 + 0.5 + 5 + 2 + 1) / 6)
    assert m["ratio_min"].item() == pytest.approx(0.5) and m["ratio_max"].item() == pytest.approx(5.0)
    assert m["approx_kl"].item() == pytest.approx(-sum(math.log(r) for r in (1.5, 0.5, 0.5, 5, 2, 1)) / 6)


def test_policy_loss_gradient_hand_numbers():
    # token-mean, A = +1, unclipped ratio 1: d loss / d logp = -A * ratio / n_tokens
    logp = torch.zeros(1, 2, dtype=torch.float64, requires_grad=True)
    loss, _ = policy_loss(logp, torch.zeros(1, 2, dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64),
                          torch.ones(1, 2, dtype=torch.float64), *CLIPS, "token-mean")
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-0.5, -0.5]], dtype=torch.float64))
    # a clipped token (ratio 1.5 > 1.28, A > 0) gets no gradient
    logp2 = torch.log(torch.tensor([[1.5]], dtype=torch.float64)).requires_grad_()
    loss, _ = policy_loss(logp2, torch.zeros(1, 1, dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64),
                          torch.ones(1, 1, dtype=torch.float64), *CLIPS, "token-mean")
    loss.backward()
    assert logp2.grad.item() == 0.0


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_policy_loss_matches_loop(agg, seed):
    logp, old, adv, mask, lengths, samples = random_batch(seed)
    loss, _ = policy_loss(logp, old, adv, mask, 0.2, 0.28, 3.0, agg, sample_index=samples, horizon=8)
    want = loop_policy_loss(logp.tolist(), old.tolist(), adv.tolist(), lengths, agg, samples.tolist(), 8)
    assert loss.item() == pytest.approx(want, abs=1e-12)


def test_per_token_advantages_equal_broadcast_rows():
    logp, old, adv, mask, _, _ = random_batch(5)
    a, _ = policy_loss(logp, old, adv, mask, *CLIPS, "token-mean")
    b, _ = policy_loss(logp, old, adv[:, None].expand_as(logp), mask, *CLIPS, "token-mean")
    assert a.item() == pytest.approx(b.item(), abs=1e-14)


@pytest.mark.parametrize("agg", AGG_MODES)
def test_micro_batch_split_invariance_of_loss(agg):
    logp, old, adv, mask, _, samples = random_batch(3, n_rows=9)
    full, _ = policy_loss(logp, old, adv, mask, *CLIPS, agg, sample_index=samples)
    w = row_loss_weights(mask, agg, samples, None)
    rng = random.Random(0)
    for _ in range(5):
        perm = list(range(9))
        rng.shuffle(perm)
        cuts = sorted(rng.sample(range(1, 9), 3))
        total = 0.0
        for lo, hi in zip([0] + cuts, cuts + [9]):
            idx = torch.tensor(perm[lo:hi])
            part, _ = policy_loss(logp[idx], old[idx], adv[idx], mask[idx], *CLIPS, agg, row_weights=w[idx])
            total += part.item()
        assert total == pytest.approx(full.item(), abs=1e-12)


def test_denominator_summed_over_parts_equals_whole():
    _, _, _, mask, _, samples = random_batch(4, n_rows=8, n_samples=4)
    for agg in AGG_MODES:
        whole = loss_denominator(mask, agg, samples)
        # split by sample so that every sample lives in one part (as the trainer shards)
        parts = [samples < 2, samples >= 2]
        assert sum(loss_denominator(mask[p], agg, samples[p]) for p in parts) == whole


def test_unknown_names_list_valid_ones():
    logp, old, adv, mask = hand_batch()
    with pytest.raises(UnknownNameError, match="token-mean, seq-mean-token-mean"):
        policy_loss(logp, old, adv, mask, *CLIPS, "token-sum")
    with pytest.raises(UnknownNameError, match="k1, k2, k3"):
        kl_penalty(logp, old, "k4")
    with pytest.raises(ValueError, match="sample_index"):
        policy_loss(logp, old, adv, mask, *CLIPS, "sample-mean")


# -- KL ---------------------------------------------------------------------------------------


def test_kl_hand_numbers():
    logp = torch.log(torch.tensor([[0.5]], dtype=torch.float64))
    ref = torch.log(torch.tensor([[0.25]], dtype=torch.float64))
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(math.log(2))
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.5 * math.log(2) ** 2)
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(0.5 + math.log(2) - 1)
    # k3 is clamped to 10 when the policy puts far less mass than the reference
    assert kl_penalty(torch.tensor([[-30.0]]), torch.tensor([[-1.0]]), "k3").item() == 10.0
    assert kl_penalty(torch.tensor([[0.0]]), torch.tensor([[0.0]]), "k3").item() == 0.0


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_kl_matches_loop(kind):
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(4, 5, generator=g, dtype=torch.float64) * 4
    ref = -torch.rand(4, 5, generator=g, dtype=torch.float64) * 4
    got = kl_penalty(logp, ref, kind)
    for n in range(4):
        for t in range(5):
            d = logp[n, t].item() - ref[n, t].item()
            want = {"k1": d, "k2": 0.5 * d * d, "k3": max(-10, min(10, math.exp(-d) + d - 1))}[kind]
            assert got[n, t].item() == pytest.approx(want, abs=1e-12)


def test_agg_loss_of_kl_uses_same_weights():
    logp, _, _, mask, lengths, samples = random_batch(6)
    ref = logp - 0.3
    kl = kl_penalty(logp, ref, "k1")
    assert agg_loss(kl, mask, "token-mean").item() == pytest.approx(0.3, abs=1e-12)


# -- log-probs from logits ----------------------------------------------------------------------


def test_token_logprobs_and_entropy_hand_numbers():
    logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25]]]))
    lp = algos.token_logprobs(logits, torch.tensor([[1]]))
    assert lp.item() == pytest.approx(math.log(0.25), abs=1e-6)
    ent = algos.token_entropy(logits)
    assert ent.item() == pytest.approx(-(0.5 * math.log(0.5) + 0.5 * math.log(0.25)), abs=1e-6)
    # temperature 2 on uniform-ish logits: probabilities of softmax(logits / 2)
    p = torch.softmax(logits / 2, -1)
    assert algos.token_logprobs(logits, torch.tensor([[0]]), 2.0).item() == pytest.approx(math.log(p[0, 0, 0]), abs=1e-6)
