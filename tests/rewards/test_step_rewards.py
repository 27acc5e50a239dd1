"""The built-in step rewards on hand-worked memories: evidence share, answer recall, their differences."""
import pytest

from memagent.rewards.protocol import Update
from memagent.rewards.step import (AnswerLikelihoodReward, AnswerRecallReward, EvidenceChainReward, EvidenceReward,
                                   answer_recall, chain_progress, evidence_share, words)


def upd(before, after, evidence=("k3 k7", "k7 v5"), answers=("v5",), kind="memory", step=0):
    return Update("k3", tuple(answers), None if evidence is None else tuple(evidence), kind, step, before, after)


def test_words_are_normalised_and_unicode_is_folded():
    assert words("The Cat, a DOG.") == ["cat", "dog"]  # lower case, punctuation and articles dropped
    composed, decomposed = "caf\u00e9", "cafe\u0301"
    assert words(composed) == words(decomposed) == ["café"]  # NFKC: one word however it is written
    assert words("\uff2b3") == ["k3"]  # a full-width K folds to K


def test_evidence_share_by_hand():
    ev = ["k3 k7", "k7 v5"]
    assert evidence_share("none none", ev) == 0.0  # empty memory: nothing held
    assert evidence_share("", ev) == 0.0
    assert evidence_share("k3 k7", ev) == (1.0 + 0.5) / 2  # the pointer whole, half of the value fact
    assert evidence_share("k7 v5 k3", ev) == 1.0
    assert evidence_share("anything", ["", "..."]) is None  # no evidence string with a word
    # repeated words count as often as the evidence has them (multisets): 2 of "k1 k1 v2"'s 3 words
    assert evidence_share("k1 v2", ["k1 k1 v2"]) == pytest.approx(2 / 3)
    assert evidence_share("k1 k1 k1 v2", ["k1 k1 v2"]) == 1.0
    assert evidence_share("Ünïcode CAFÉ!", ["ünïcode café"]) == 1.0  # case and punctuation of any script


def test_evidence_split_over_two_updates_pays_each_its_share():
    """Pointer-first: the update that keeps the pointer earns +0.75 at once; moving on to the value fact keeps
    the share (0), dropping it for a distractor loses it."""
    r = EvidenceReward()
    got = r.score([upd("none none", "k3 k7"), upd("k3 k7", "k7 v5", step=1), upd("k3 k7", "k1 v9", step=1),
                   upd("k7 v5", "k7 v5", step=2)])
    assert got == [0.75, 0.0, -0.75, 0.0]


def test_evidence_is_not_scored_without_evidence_or_outside_memory_updates():
    r = EvidenceReward()
    assert r.score([upd("a", "k3 k7", evidence=None), upd("a", "k3 k7", evidence=()),
                    upd("k3 k7", "\\boxed{v5}", kind="final"), upd("x", "x", kind="query")]) == [None] * 4


def test_chain_progress_by_hand():
    ev = ["k3 k7", "k7 v5"]  # the two hops in order
    assert chain_progress("none none", ev) == 0.0 and chain_progress("", ev) == 0.0
    assert chain_progress("k3 k7", ev) == 0.5  # the pointer: half way
    assert chain_progress("k7 v5", ev) == 1.0  # the value fact: the end of the chain
    assert chain_progress("k3 k7 k7 v5", ev) == 1.0  # the furthest hop held counts
    assert chain_progress("k7 k3", ev) == 0.0  # the words, not in order: a different fact
    assert chain_progress("k7 v2", ev) == 0.0 and chain_progress("k3", ev) == 0.0  # a part of a hop is not it
    assert chain_progress("K3, k7!", ev) == 0.5  # normalised words, as `evidence`
    assert chain_progress("x k1 k1 v2 y", ["k1 k1 v2"]) == 1.0  # repeated words, as one run
    assert chain_progress("k1 v2 k1", ["k1 k1 v2"]) == 0.0
    assert chain_progress("Ünïcode CAFÉ", ["ünïcode cafe\u0301"]) == 1.0  # NFKC folds the decomposed é
    assert chain_progress("anything", ["", "..."]) is None


def test_evidence_chain_pays_each_hop_in_order_and_takes_back_what_is_lost():
    """Where `evidence` pays the swap from pointer to value 0 (both hold 3 of the 4 words), the chain pays it
    the second half; a hop skipped (the value fact before the pointer: a lucky copy) pays 0; losing a hop costs
    what it is worth."""
    r = EvidenceChainReward()
    got = r.score([upd("none none", "k3 k7"), upd("k3 k7", "k7 v5", step=1), upd("k3 k7", "k1 v9", step=1),
                   upd("k7 v5", "k7 v5", step=2), upd("k7 v5", "k3 k7", step=2), upd("none none", "k7 v5"),
                   upd("k7 v5", "k1 v9", step=3), upd("x", "k3 k7", evidence=None),
                   upd("k3 k7", "\\boxed{v5}", kind="final")])
    assert got == [0.5, 0.5, -0.5, 0.0, -0.5, 0.0, -1.0, None, None]
    assert EvidenceReward().score([upd("k3 k7", "k7 v5"), upd("none none", "k7 v5")]) == [0.0, 0.75]
    # three hops: one at a time pays a third each; from the first hop straight to the last pays 0
    three = ("a b", "b c", "c v")
    assert r.score([upd("z", "a b", three), upd("a b", "b c", three), upd("b c", "c v", three),
                    upd("a b", "c v", three)]) == pytest.approx([1 / 3, 1 / 3, 1 / 3, 0.0])


def test_evidence_chain_loss_weight_scales_only_what_a_lost_hop_costs():
    """loss_weight 0: a lost hop costs nothing (only the final answer's reward says so); 0.25: a quarter of its
    level; gains and the skipped hop are paid as with the default."""
    updates = [upd("none none", "k3 k7"), upd("k3 k7", "k7 v5", step=1), upd("k3 k7", "k1 v9", step=1),
               upd("k7 v5", "k1 v9", step=3), upd("none none", "k7 v5")]
    assert EvidenceChainReward(loss_weight=0).score(updates) == [0.5, 0.5, 0.0, 0.0, 0.0]
    assert EvidenceChainReward(loss_weight=0.25).score(updates) == [0.5, 0.5, -0.125, -0.25, 0.0]
    assert EvidenceChainReward().score(updates) == [0.5, 0.5, -0.5, -1.0, 0.0]
    for bad in (-1, float("nan"), float("inf"), True, "1"):
        with pytest.raises(ValueError, match="loss_weight must be a finite number >= 0"):
            EvidenceChainReward(loss_weight=bad)
    from memagent.rewards.registry import build_reward

    assert build_reward("evidence-chain", "step", loss_weight=0).loss_weight == 0.0  # as step_reward_options
    from memagent.rewards.registry import UnknownReward

    with pytest.raises(UnknownReward, match=r"reward 'evidence-chain': loss_weight must be a finite number >= 0, "
                                            r"got -1"):
        build_reward("evidence-chain", "step", loss_weight=-1)  # one clear line from the CLI, not a traceback


def test_answer_recall_by_hand():
    assert answer_recall("none", ["v5"]) == 0.0
    assert answer_recall("the answer is Paris", ["Paris, France", "paris"]) == 1.0  # best over the golds
    assert answer_recall("Paris", ["Paris France"]) == 0.5
    assert answer_recall("new new", ["new new york"]) == pytest.approx(2 / 3)  # repeated words, multisets
    assert answer_recall("anything", ["the", "."]) == 0.0  # no gold with a word
    r = AnswerRecallReward()
    # the pointer holds no word of the answer: answer recall pays it nothing (evidence does: see above)
    assert r.score([upd("none none", "k3 k7"), upd("k3 k7", "k7 v5", step=1), upd("m", "v5", kind="final")]) \
        == [0.0, 1.0, None]


class ScriptedPolicy:
    """A backend whose `score` gives each answer token log-prob -1 unless the prompt holds the answer (-0.25)."""

    def __init__(self, tok):
        self.tokenizer, self.seen = tok, []

    def encode_many(self, prompts):
        self.seen.append(list(prompts))
        return [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]

    def score(self, prompts, responses):
        out = []
        for p, r in zip(prompts, responses):
            text = self.tokenizer.decode(p)
            out.append([-0.25 if "v5" in text else -1.0] * len(r))
        return out


def test_answer_likelihood_is_after_minus_before_in_one_batch():
    from types import SimpleNamespace

    from memagent.backends.tiny import build_tokenizer

    tok = build_tokenizer(vocab_size=1024)
    policy = ScriptedPolicy(tok)
    r = AnswerLikelihoodReward()
    with pytest.raises(RuntimeError, match="attach"):
        r.score([upd("a", "b")])
    r.attach(policy, SimpleNamespace(final_template="M {memory} Q {question}"))
    got = r.score([upd("none", "k7 v5"), upd("k7 v5", "k1 v2", step=1), upd("x", "y", kind="final")])
    assert got == [pytest.approx(0.75), pytest.approx(-0.75), None]
    assert len(policy.seen) == 1 and policy.seen[0] == ["M none Q k3", "M k7 v5 Q k3", "M k7 v5 Q k3", "M k1 v2 Q k3"]
    with pytest.raises(ValueError, match="answer"):
        AnswerLikelihoodReward(answer_format="no placeholder")
