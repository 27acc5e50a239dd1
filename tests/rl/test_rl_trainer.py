"""The training loop end to end on a tiny model: learning, resume, dynamic sampling, SFT, CLI data."""
import json
import math

import pytest
import torch

from memagent.rl.config import load_config
from memagent.rl.rollout import RolloutBatch, collect_rollouts, dynamic_sampling_filter, generate_rollouts
from memagent.rl.trainer import train

TIMING_KEYS = {"rollout_s", "update_s", "step_s", "tokens_per_s"}


@pytest.fixture(scope="module")
def tok():
    from memagent.backends.tiny import build_tokenizer

    return build_tokenizer(vocab_size=1024)


def fresh_model(tok, seed=0):
    from transformers import AutoModelForCausalLM

    from memagent.backends.tiny import tiny_config

    cfg = tiny_config(len(tok), hidden_size=48, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2)
    cfg.eos_token_id, cfg.pad_token_id = tok.eos_token_id, tok.pad_token_id
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    model.generation_config.eos_token_id = [tok.eos_token_id, tok.pad_token_id]
    model.generation_config.pad_token_id = tok.pad_token_id
    return model


def samples(n=24):
    return [{"id": str(i), "question": f"what is the value of key {i}?",
             "document": f"the key {i} has the value {i * 7}. the river is blue and the city is old.",
             "answers": [str(i * 7)]} for i in range(n)]


def symbol_reward(prediction, golds):
    """Learnable in seconds: 1 when the final reply does not start with a letter (about 30% of
    the tiny tokenizer's tokens: digits, punctuation, symbols, blanks)."""
    return 0.0 if (prediction or "").strip()[:1].isalpha() else 1.0


def small_config(out, *extra):
    return load_config(None, [
        f"out_dir={out}", "rollout.batch_size=4", "rollout.group_size=8", "update.mini_batch_size=2",
        "update.micro_batch_size=32", "agent.chunk_tokens=12", "agent.memory_tokens=1", "agent.answer_tokens=1",
        "optim.lr=3e-2", "optim.warmup_steps=0", "optim.weight_decay=0", "save_every=0", "progress=false", *extra])


@pytest.mark.slow
def test_end_to_end_reward_rises_and_every_parameter_changes(tok, tmp_path):
    model = fresh_model(tok)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    res = train(small_config(tmp_path / "run", "total_steps=8"), samples(), symbol_reward, model=model, tokenizer=tok)
    rewards = [r["reward"] for r in res.metrics]
    print("reward curve", [round(r, 3) for r in rewards])  # measured: .28 .25 .62 .53 .69 .88 .94 1.0
    assert sum(rewards[:2]) / 2 < 0.4 and sum(rewards[-2:]) / 2 > 0.85, rewards
    changed = [n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert len(changed) == len(before), set(before) - set(changed)  # weight decay is 0: gradients did it
    rec = res.metrics[-1]
    for key in ("reward", "accuracy", "kept_groups", "conversations_per_sample", "loss", "clip_frac", "kl",
                "entropy", "grad_norm", "generated_tokens", "tokens_per_s", "rollout_s", "update_s"):
        assert key in rec and math.isfinite(rec[key]), key
    assert rec["conversations_per_sample"] > 2  # several chunks + the final answer per rollout
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == list(range(1, 9))
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(res.checkpoint / "model")
    for n, p in loaded.named_parameters():
        assert torch.equal(p, dict(model.named_parameters())[n].detach()), n


def test_resume_matches_uninterrupted_run_step_by_step(tok, tmp_path):
    extra = ["total_steps=4", "save_every=2", "rollout.batch_size=2", "rollout.group_size=2",
             "update.mini_batch_size=1", "loss.kl_coef=0.01", "loss.sft_coef=0.5", "loss.sft_batch_size=2"]
    aux = [(tok(f"row {i}")["input_ids"], tok(f" reply {i}", add_special_tokens=False)["input_ids"]) for i in range(5)]
    full = train(small_config(tmp_path / "a", *extra), samples(), symbol_reward, model=fresh_model(tok), tokenizer=tok,
                 sft_data=aux)
    stopped = train(small_config(tmp_path / "b", *extra), samples(), symbol_reward, model=fresh_model(tok),
                    tokenizer=tok, callback=lambda step, m: step < 2, sft_data=aux)
    assert [r["step"] for r in stopped.metrics] == [1, 2]
    assert (tmp_path / "b" / "checkpoints" / "step_000002").is_dir()
    resumed = train(small_config(tmp_path / "b", *extra, "resume=true"), samples(), symbol_reward,
                    model=fresh_model(tok), tokenizer=tok, sft_data=aux)  # the auxiliary rows draw the same too
    assert [r["step"] for r in resumed.metrics] == [3, 4]
    for a, b in zip(full.metrics[2:], resumed.metrics):
        a = {k: v for k, v in a.items() if k not in TIMING_KEYS}
        b = {k: v for k, v in b.items() if k not in TIMING_KEYS}
        assert a == b  # exactly equal, step by step
    lines = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3, 4]
    for name, p in full.model.named_parameters():
        assert torch.equal(p, dict(resumed.model.named_parameters())[name]), name


def test_existing_run_needs_resume_flag(tok, tmp_path):
    from memagent.config import ConfigError

    cfg = small_config(tmp_path / "r", "total_steps=1", "rollout.batch_size=2", "rollout.group_size=2",
                       "update.mini_batch_size=2", "loss.kl_coef=0")
    train(cfg, samples(4), symbol_reward, model=fresh_model(tok), tokenizer=tok)
    with pytest.raises(ConfigError, match="resume=true"):
        train(cfg, samples(4), symbol_reward, model=fresh_model(tok), tokenizer=tok)


def test_rollout_rows_and_dynamic_sampling(tok):
    from memagent.backends.hf import TransformersBackend
    from memagent.config import AgentConfig
    from memagent.rl.samples import load_samples

    backend = TransformersBackend(fresh_model(tok).eval(), tok, want_logprobs=True)
    agent = AgentConfig(chunk_tokens=6, memory_tokens=2, answer_tokens=2, temperature=1.0)
    qs = load_samples(samples(3))
    qs[1] = type(qs[1])(qs[1].id, qs[1].question, qs[1].document + " more words here to add two chunks.", qs[1].answers)
    batch = generate_rollouts(backend, agent, qs, [10, 11, 12], 4, symbol_reward, seed=3)
    assert batch.advantages is None  # computed only once the groups to train on are known
    batch = batch.with_advantages()
    counts = batch.conversations_per_sample()
    assert batch.num_samples == 12 and len(set(counts[:4].tolist() + counts[4:8].tolist())) == 2  # differing n_i
    for n in range(batch.num_rows):  # every row carries its sample's advantage and group
        s = int(batch.sample_index[n])
        assert batch.advantages[n] == batch.sample_advantages[s]
        assert batch.group_id[n] == [10, 11, 12][s // 4]
        assert len(batch.rollout_logprobs[n]) == len(batch.response_ids[n]) > 0
    assert int(batch.is_final.sum()) == 12  # one final answer per sample, the last row of each
    last_rows = [max(n for n in range(batch.num_rows) if batch.sample_index[n] == s) for s in range(12)]
    assert batch.is_final[last_rows].all()
    # the sampling-time log-probs equal the trainer's recomputation (old_logprobs=rollout is exact here)
    from memagent.rl.distributed import DistInfo
    from memagent.rl.packing import rows_logprobs

    again = rows_logprobs(backend.model, batch.prompt_ids, batch.response_ids, pad_id=tok.pad_token_id,
                          micro_batch_size=7, info=DistInfo())
    diff = max((a - torch.tensor(b)).abs().max().item() for a, b in zip(again, batch.rollout_logprobs))
    assert diff < 1e-4, diff
    # dynamic sampling keeps exactly the groups with unequal rewards; advantages are then computed on them:
    # group 10: rewards 1, 0, 0, 0 (mean .25); group 12: 0, .5, .5, 0 (mean .25)
    batch.rewards = torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 1, 0, 0.5, 0.5, 0])
    kept = dynamic_sampling_filter(batch).with_advantages()
    assert kept.sample_group.tolist() == [10] * 4 + [12] * 4
    assert kept.sample_advantages.tolist() == [0.75, -0.25, -0.25, -0.25, -0.25, 0.25, 0.25, -0.25]
    assert kept.advantages.tolist() == kept.sample_advantages[kept.sample_index].tolist()
    assert kept.num_rows == int(counts[:4].sum() + counts[8:].sum())
    assert set(kept.sample_index.tolist()) == set(range(8))
    both = RolloutBatch.concat([kept, kept.select_samples(torch.tensor([True] * 4 + [False] * 4))])
    assert both.num_samples == 12 and both.sample_index.max() == 11


def test_dynamic_sampling_in_the_loop_keeps_informative_groups(tok, tmp_path):
    from memagent.rl.samples import load_samples
    from memagent.rl.trainer import Trainer

    def half_reward(prediction, golds):  # all-equal (zero) groups for even keys, mostly mixed for odd
        key = int(golds[0]) // 7
        return float(len(prediction or "") % 2) if key % 2 else 0.0

    cfg = small_config(tmp_path / "ds", "total_steps=1", "rollout.dynamic_sampling=true",
                       "rollout.max_sampling_rounds=3", "loss.kl_coef=0", "update.old_logprobs=rollout")
    trainer = Trainer(cfg, load_samples(samples()), half_reward, fresh_model(tok), tok)
    algo, run = trainer.algorithm, trainer.recipe
    got = collect_rollouts(algo.engine.backend(), cfg, algo.samples, run.data, half_reward, step=0, info=run.info)
    batch, parts, rec = got.batch, got.parts, got.metrics
    print("dynamic sampling", rec["kept_groups"], rec["sampling_rounds"], parts)
    rewards = {}
    for g, r in zip(batch.sample_group.tolist(), batch.rewards.tolist()):
        rewards.setdefault(g, []).append(r)
    assert rewards and all(len(set(v)) > 1 for v in rewards.values())  # only groups with unequal rewards
    assert all(len(v) == 8 for v in rewards.values())  # whole groups
    assert rec["kept_groups"] == len(rewards) <= 4 and rec["sampled_groups"] == 4 * rec["sampling_rounds"]
    assert rec["sampling_rounds"] == 3 or rec["kept_groups"] == 4  # stopped early only with B groups kept
    assert sorted(g for p in parts for g in p) == sorted(rewards)  # every kept group in one mini-batch
    for g, r in rewards.items():  # the advantages of the kept groups: reward - the group's mean
        adv = batch.sample_advantages[batch.sample_group == g]
        assert torch.allclose(adv, torch.tensor(r) - sum(r) / len(r), atol=1e-6)
    metrics = algo.update(batch, parts)
    assert metrics["optimizer_steps"] == sum(1 for p in parts if p)
    run.cleanup()


def test_samples_from_records_and_clear_errors():
    from memagent.errors import InputError
    from memagent.rl.samples import QASample, load_samples

    s = load_samples([{"id": 1, "question": "q?", "context": "text", "answers": "a"},
                      {"question": "q2?", "document": (b for b in ["x", "y"]), "answers": ["b", "c"]}])
    assert s[0] == QASample("1", "q?", "text", ("a",))
    assert s[1].document == ("x", "y") and s[1].answers == ("b", "c")  # an iterator is read once, kept
    with pytest.raises(InputError, match="sample 0: missing field.s. answers, document"):
        load_samples([{"question": "q"}])
    with pytest.raises(InputError, match="'answers' is empty"):
        load_samples([{"question": "q", "context": "c", "answers": []}])
    with pytest.raises(InputError, match="empty"):
        load_samples([])


def test_auxiliary_sft_loss_is_mixed_into_each_optimiser_step(tok, tmp_path):
    """loss.sft_coef (not in the paper, PPO-ptx style): with a constant reward every advantage is 0, so the
    policy-gradient term is zero and only the auxiliary loss moves the weights: it must teach its rows,
    and without it the weights must not move at all."""
    from memagent.config import ConfigError

    prompt, target = tok("the key 3 has")["input_ids"], tok(" the value", add_special_tokens=False)["input_ids"]
    rows = [(prompt, target)] * 4
    extra = ["total_steps=6", "rollout.batch_size=2", "rollout.group_size=2", "update.mini_batch_size=1",
             "loss.kl_coef=0", "optim.lr=1e-2"]
    model = fresh_model(tok)
    res = train(small_config(tmp_path / "a", *extra, "loss.sft_coef=1.0", "loss.sft_batch_size=3"), samples(),
                lambda pred, golds: 0.0, model=model, tokenizer=tok, sft_data=rows)
    losses = [r["sft_loss"] for r in res.metrics]
    print("sft loss", [round(x, 3) for x in losses])
    assert all(r["pg_loss"] == 0 for r in res.metrics)
    assert losses[-1] < 0.2 * losses[0] and res.metrics[-1]["sft_token_accuracy"] == 1.0
    with torch.no_grad():  # the taught reply is now the greedy one
        out = model.eval().generate(torch.tensor([prompt]), max_new_tokens=len(target), do_sample=False)
    assert out[0, len(prompt):].tolist() == target

    still = fresh_model(tok)
    before = {n: p.detach().clone() for n, p in still.named_parameters()}
    res = train(small_config(tmp_path / "b", *extra, "total_steps=2"), samples(), lambda pred, golds: 0.0, model=still,
                tokenizer=tok)
    assert "sft_loss" not in res.metrics[-1]
    assert all(torch.equal(p, before[n]) for n, p in still.named_parameters())

    with pytest.raises(ConfigError, match="no rows were given"):
        train(small_config(tmp_path / "c", *extra, "loss.sft_coef=0.5"), samples(), symbol_reward,
              model=fresh_model(tok), tokenizer=tok)
    with pytest.raises(ConfigError, match="loss.sft_coef is 0"):
        train(small_config(tmp_path / "d", *extra), samples(), symbol_reward, model=fresh_model(tok), tokenizer=tok,
              sft_data=rows)
    with pytest.raises(ConfigError, match="sft_coef must be a finite number >= 0"):
        small_config(tmp_path / "e", "loss.sft_coef=-1")


def test_a_sample_may_start_its_rollouts_from_a_given_memory(tok):
    from memagent.backends.base import Generation
    from memagent.config import AgentConfig
    from memagent.errors import InputError
    from memagent.rl.samples import load_samples

    [s] = load_samples([{"question": "q?", "context": "alpha beta", "answers": ["a"], "memory": "old note"}])
    assert s.memory == "old note" and load_samples([{"question": "q", "context": "c", "answers": "a"}])[0].memory is None
    with pytest.raises(InputError, match="'memory' .* must be a string"):
        load_samples([{"question": "q", "context": "c", "answers": "a", "memory": 3}])

    class Echo:  # replies with the prompt's memory field; records the prompts
        tokenizer, max_window, prompts = tok, None, []

        def generate(self, prompts, params):
            self.prompts += prompts
            reply = tok("x", add_special_tokens=False)["input_ids"]
            return [Generation(text=p.split("M:")[1].split("|")[0], token_ids=reply, logprobs=[-0.1] * len(reply),
                               prompt_token_ids=tok(p)["input_ids"]) for p in prompts]

        def prompt_length(self, prompt):
            return len(tok(prompt)["input_ids"])

    backend = Echo()
    cfg = AgentConfig(chunk_tokens=64, memory_tokens=8, answer_tokens=4, query_tokens=8, temperature=1.0,
                      memory_template="M:{memory}|C:{chunk}|Q:{question}", final_template="M:{memory}|Q:{question}")
    batch = generate_rollouts(backend, cfg, [s], [0], 2, lambda pred, golds: 0.0, seed=0)
    assert backend.prompts[0].startswith("M:old note|C:alpha beta") and len(backend.prompts) == 4
    # every row carries the backend's fields where they belong: prompt ids, reply ids, their log-probs
    reply = tok("x", add_special_tokens=False)["input_ids"]
    assert sorted(batch.prompt_ids) == sorted(tok(p)["input_ids"] for p in backend.prompts)
    assert batch.response_ids == [reply] * 4 and batch.rollout_logprobs == [[-0.1] * len(reply)] * 4
