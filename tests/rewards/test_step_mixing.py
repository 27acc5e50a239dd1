"""Step advantages centred per (question, step), mixed with the outcome advantage; on a hand-made batch and
through generate_rollouts with a scripted policy (the rows carry the hand-worked advantages)."""
import pytest
import torch

from memagent.rl.rollout import RolloutBatch, generate_rollouts
from memagent.rl.step_rewards import StepTally, mix_advantages, step_advantages, step_key

NAN = float("nan")


def test_step_advantages_are_centred_within_question_and_step_by_hand():
    # rows: question 7 steps 0, 0, 1, 1, 0 (three rollouts at step 0), question 9 step 0 twice; one unscored
    rewards = torch.tensor([0.75, 0.0, 0.0, 0.5, 0.3, 1.0, NAN])
    groups = torch.tensor([7, 7, 7, 7, 7, 9, 9])
    keys = torch.tensor([step_key("memory", s) for s in (0, 0, 1, 1, 0, 0, 0)])
    got = step_advantages(rewards, groups, keys)
    # q7 step 0: mean(0.75, 0, 0.3) = 0.35; q7 step 1: mean(0, 0.5) = 0.25; q9 step 0: one scored row -> 0
    assert torch.allclose(got, torch.tensor([0.4, -0.35, -0.25, 0.25, -0.05, 0.0, 0.0]), atol=1e-7)
    scaled = step_advantages(rewards, groups, keys, scale=True)
    std0 = torch.tensor([0.4, -0.35, -0.05]).pow(2).sum().div(2).sqrt()  # unbiased std of q7 step 0
    std1 = torch.tensor([-0.25, 0.25]).pow(2).sum().div(1).sqrt()
    assert torch.allclose(scaled, torch.tensor([0.4 / std0, -0.35 / std0, -0.25 / std1, 0.25 / std1, -0.05 / std0,
                                                0.0, 0.0]), atol=1e-5)
    # another kind at the same step index is another set
    keys2 = torch.tensor([step_key("memory", 0), step_key("query", 0)])
    assert step_advantages(torch.tensor([1.0, 0.0]), torch.tensor([1, 1]), keys2).tolist() == [0.0, 0.0]
    assert step_advantages(torch.full((3,), NAN), torch.zeros(3, dtype=torch.long), torch.zeros(3, dtype=torch.long)) \
        .tolist() == [0.0, 0.0, 0.0]


def test_mix_keeps_the_outcome_on_unscored_rows_and_is_the_paper_at_one():
    outcome = torch.tensor([0.5, 0.5, 0.5, -0.5])
    step = torch.tensor([0.375, 0.0, 0.0, -0.375])
    scored = torch.tensor([True, True, False, True])
    assert torch.allclose(mix_advantages(outcome, step, scored, 0.8), torch.tensor([0.475, 0.4, 0.5, -0.475]))
    assert mix_advantages(outcome, step, scored, 1.0) is outcome  # a = 1: the paper's advantages, untouched
    assert torch.equal(mix_advantages(outcome, step, scored, 0.0), torch.tensor([0.375, 0.0, 0.5, -0.375]))
    with pytest.raises(ValueError, match="mix"):
        mix_advantages(outcome, step, scored, 1.5)


def hand_batch(step_rewards):
    """Two rollouts of question 3, each: memory step 0, memory step 1, final; rewards 1 and 0."""
    return RolloutBatch(
        prompt_ids=[[1]] * 6, response_ids=[[2]] * 6, rollout_logprobs=None,
        sample_index=torch.tensor([0, 0, 0, 1, 1, 1]), is_final=torch.tensor([False, False, True] * 2),
        rewards=torch.tensor([1.0, 0.0]), sample_group=torch.tensor([3, 3]), predictions=["v5", "v2"],
        step_rewards=step_rewards,
        step_keys=torch.tensor([step_key(k, s) for k, s in [("memory", 0), ("memory", 1), ("final", 2)] * 2]))


def test_with_advantages_mixes_on_a_hand_made_batch():
    b = hand_batch(torch.tensor([0.75, 0.0, NAN, 0.0, 0.0, NAN]))
    plain = b.with_advantages().advantages
    assert plain.tolist() == [0.5, 0.5, 0.5, -0.5, -0.5, -0.5]  # mix 1 (default): the paper's broadcast
    mixed = b.with_advantages(step_mix=0.8).advantages
    assert torch.allclose(mixed, torch.tensor([0.475, 0.4, 0.5, -0.475, -0.4, -0.5]))
    # the step fields follow the rows through select_samples and concat
    one = b.select_samples(torch.tensor([False, True]))
    assert one.step_keys.tolist() == b.step_keys[3:].tolist() and torch.equal(one.step_rewards.nan_to_num(-9), b.step_rewards[3:].nan_to_num(-9))
    both = RolloutBatch.concat([one, one])
    assert both.step_rewards.shape == (6,) and both.step_keys.shape == (6,)
    tally = StepTally()
    tally.add(b)
    assert (tally.total, tally.scored, tally.memory_rows, tally.unscored_samples) == (0.75, 4.0, 4.0, 0.0)
    no_evidence = hand_batch(torch.tensor([0.75, 0.0, NAN, NAN, NAN, NAN]))  # sample 1 without evidence
    tally = StepTally()
    tally.add(no_evidence)
    assert tally.unscored_samples == 1.0
    assert torch.allclose(no_evidence.with_advantages(step_mix=0.8).advantages,  # a set of one row: A_step 0
                          torch.tensor([0.4, 0.4, 0.5, -0.5, -0.5, -0.5]))


class Scripted:
    """A policy whose replies follow a script by call (lock-step batches) and position within the batch."""

    max_window = None

    def __init__(self, tok, script):
        self.tokenizer, self.script, self.calls = tok, script, 0

    def generate(self, prompts, params):
        from memagent.backends.base import Generation

        replies = self.script[self.calls]
        self.calls += 1
        out = []
        for p, text in zip(prompts, replies, strict=True):
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            out.append(Generation(text=text, token_ids=ids, logprobs=[-0.1] * len(ids),
                                  prompt_token_ids=self.tokenizer(p)["input_ids"]))
        return out

    def prompt_length(self, prompt):
        return len(self.tokenizer(prompt)["input_ids"])


def test_a_training_step_with_the_evidence_reward_carries_the_expected_advantages(tiny_tokenizer):
    """Pointer-first two-hop by hand: rollout 0 keeps the pointer then copies the value and answers v5;
    rollout 1 copies a distractor twice. Evidence shares 0.75, 0.75 vs 0, 0 -> step rewards [0.75, 0], [0, 0];
    outcome advantages +-0.5; A at a = 0.8 as worked out in test_with_advantages_mixes_on_a_hand_made_batch."""
    from memagent.config import AgentConfig
    from memagent.rewards.registry import build_reward
    from memagent.rl.samples import load_samples

    [s] = load_samples([{"id": "q", "question": "k3", "context": "fact k3 k7 fact k7 v5", "answers": ["v5"],
                         "evidence": ["k3 k7", "k7 v5"]}])
    cfg = AgentConfig(chunk_tokens=16, memory_tokens=16, answer_tokens=8, query_tokens=8, temperature=1.0,
                      memory_template="M:{memory}|C:{chunk}|Q:{question}", final_template="M:{memory}|Q:{question}",
                      empty_memory="none none")
    chunks = len(tiny_tokenizer("fact k3 k7 fact k7 v5", add_special_tokens=False)["input_ids"])
    script = [["k3 k7", "k1 v2"], ["k7 v5", "k1 v2"], ["\\boxed{v5}", "\\boxed{v2}"]]
    cfg = AgentConfig(**{**cfg.__dict__, "chunk_tokens": (chunks + 1) // 2})  # two chunks
    backend = Scripted(tiny_tokenizer, script)
    batch = generate_rollouts(backend, cfg, [s], [3], 2, build_reward("boxed", "outcome"), seed=0,
                              step_reward=build_reward("evidence", "step"))
    assert batch.predictions == ["v5", "v2"] and batch.rewards.tolist() == [1.0, 0.0]
    got = batch.step_rewards.tolist()
    assert got[:2] == [0.75, 0.0] and got[3:5] == [0.0, 0.0] and got[2] != got[2] and got[5] != got[5]  # NaN: final
    assert torch.allclose(batch.with_advantages(step_mix=0.8).advantages,
                          torch.tensor([0.475, 0.4, 0.5, -0.475, -0.4, -0.5]))
    assert torch.equal(batch.with_advantages(step_mix=1.0).advantages, batch.with_advantages().advantages)

    class ChunkWords:  # a plug-in step reward that reads the chunk of each update (needs_chunks)
        name, kind, needs_chunks = "chunk-words", "step", True
        seen = []

        def score(self, items):
            self.seen += [(it.step, it.chunk) for it in items]
            return [float(len(it.chunk.split())) if it.chunk else float("inf") for it in items]  # inf: unscored

    backend.calls = 0
    reader = ChunkWords()
    batch = generate_rollouts(backend, cfg, [s], [3], 2, build_reward("boxed", "outcome"), seed=0, step_reward=reader)
    chunk_texts = [c for _, c in reader.seen[:2]]
    assert "".join(chunk_texts).replace(" ", "") == "factk3k7factk7v5"  # the document, in the chunks read
    assert [st for st, _ in reader.seen] == [0, 1, 2] * 2 and reader.seen[2][1] is None  # the final: no chunk
    assert torch.isnan(batch.step_rewards[[2, 5]]).all()  # a non-finite value is "not scored"


def tiny_policy(tok, seed=0):
    from transformers import AutoModelForCausalLM

    from memagent.backends.tiny import tiny_config

    cfg = tiny_config(len(tok), hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1)
    cfg.eos_token_id, cfg.pad_token_id = tok.eos_token_id, tok.pad_token_id
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    model.generation_config.eos_token_id = [tok.eos_token_id, tok.pad_token_id]
    model.generation_config.pad_token_id = tok.pad_token_id
    return model


def two_step_run(tok, out, *extra):
    from memagent.rl.config import load_config
    from memagent.rl.trainer import train

    data = [{"id": str(i), "question": f"key {i}?", "document": f"the key {i} has the value {i * 7}. the sky is blue.",
             "answers": [str(i * 7)], **({"evidence": [f"key {i} has the value {i * 7}"]} if i % 2 else {})}
            for i in range(8)]
    cfg = load_config(None, [f"out_dir={out}", "rollout.batch_size=2", "rollout.group_size=4", "update.mini_batch_size=1",
                             "update.micro_batch_size=16", "agent.chunk_tokens=8", "agent.memory_tokens=6",
                             "agent.answer_tokens=2", "optim.lr=1e-2", "optim.warmup_steps=0", "save_every=0",
                             "progress=false", "total_steps=2", "reward=sub_em", *extra])
    model = tiny_policy(tok)
    res = train(cfg, data, model=model, tokenizer=tok)
    return res.metrics, {n: p.detach().clone() for n, p in model.named_parameters()}


TIMING = {"rollout_s", "update_s", "step_s", "tokens_per_s"}


def test_training_with_a_step_reward_logs_it_and_at_mix_one_is_the_paper_exactly(tiny_tokenizer, tmp_path):
    plain, w_plain = two_step_run(tiny_tokenizer, tmp_path / "plain")
    one, w_one = two_step_run(tiny_tokenizer, tmp_path / "one", "step_reward=evidence", "step_mix=1")
    mixed, w_mixed = two_step_run(tiny_tokenizer, tmp_path / "mixed", "step_reward=evidence", "step_mix=0.5")
    key = "step_reward/evidence"
    for rec in one + mixed:
        assert {key, f"{key}/scored_rows", f"{key}/unscored_samples"} <= set(rec)
        assert 0.0 <= rec[f"{key}/scored_rows"] <= 1.0
    assert key not in plain[0]
    # a = 1: the same metrics (beside the step reward's own) and the same weights, bit for bit
    for a, b in zip(plain, one):
        assert {k: v for k, v in a.items() if k not in TIMING} == \
            {k: v for k, v in b.items() if k not in TIMING and not k.startswith("step_reward/")}
    assert all(torch.equal(w_plain[n], w_one[n]) for n in w_plain)
    # even samples carry no evidence: their memory updates are unscored, counted, no crash
    counts = [rec[f"{key}/unscored_samples"] for rec in one]
    assert set(counts) <= {0.0, 4.0, 8.0} and sum(counts) > 0, counts  # whole questions (G = 4 rollouts each)
    assert mixed[0]["reward"] == one[0]["reward"]  # the first rollouts precede any update


def test_step_reward_with_packing_lora_and_exact_resume(tiny_tokenizer, tmp_path):
    """The mixed advantages are per-row numbers made before the update: packed micro-batches, LoRA adapters and
    a resumed run take them as they take the outcome advantages (a resumed run's steps equal the uninterrupted)."""
    from memagent.rl.config import load_config
    from memagent.rl.trainer import train

    data = [{"id": str(i), "question": f"key {i}?", "document": f"the key {i} has the value {i * 7}. the sky is blue.",
             "answers": [str(i * 7)], "evidence": [f"key {i} has the value {i * 7}"]} for i in range(8)]
    common = ["rollout.batch_size=2", "rollout.group_size=4", "update.mini_batch_size=1", "agent.chunk_tokens=8",
              "agent.memory_tokens=6", "agent.answer_tokens=2", "optim.lr=1e-2", "optim.warmup_steps=0",
              "progress=false", "total_steps=2", "save_every=1", "reward=sub_em", "step_reward=evidence",
              "step_mix=0.5", "update.packing=true", "update.micro_batch_tokens=256", "lora.r=4"]

    def run(out, *extra, callback=None):
        return train(load_config(None, [f"out_dir={out}", *common, *extra]), data, model=tiny_policy(tiny_tokenizer),
                     tokenizer=tiny_tokenizer, callback=callback)

    full = run(tmp_path / "a")
    assert all("step_reward/evidence" in r and r["optimizer_steps"] == 2 for r in full.metrics)
    run(tmp_path / "b", callback=lambda step, m: step < 1)
    resumed = run(tmp_path / "b", "resume=true")
    assert [r["step"] for r in resumed.metrics] == [2]
    assert {k: v for k, v in full.metrics[1].items() if k not in TIMING} == \
        {k: v for k, v in resumed.metrics[0].items() if k not in TIMING}


def test_answer_likelihood_with_the_policy_in_training(tiny_tokenizer, tmp_path):
    """answer-likelihood asks the rollout policy (the transformers backend, attached each step): the same numbers
    as the backend's own teacher-forced log-probs, and a run with it logs its mean."""
    from memagent.backends.hf import TransformersBackend
    from memagent.config import AgentConfig
    from memagent.rewards.protocol import Update
    from memagent.rewards.registry import build_reward

    backend = TransformersBackend(tiny_policy(tiny_tokenizer), tiny_tokenizer)
    reward = build_reward("answer-likelihood", "step")
    agent = AgentConfig(final_template="M {memory} Q {question}")
    reward.attach(backend, agent)
    [got] = reward.score([Update("q?", ("42",), None, "memory", 0, "none", "the answer is 42")])
    ans = tiny_tokenizer("42", add_special_tokens=False)["input_ids"]
    before, after = backend.score(backend.encode_many(["M none Q q?", "M the answer is 42 Q q?"]), [ans, ans])
    assert got == pytest.approx(sum(after) / len(after) - sum(before) / len(before), abs=1e-6)
    metrics, _ = two_step_run(tiny_tokenizer, tmp_path / "lik", "step_reward=answer-likelihood")
    assert all(abs(r["step_reward/answer-likelihood"]) < 50 and r["step_reward/answer-likelihood/scored_rows"] == 1.0
               for r in metrics)
