"""data.max_chunks (middle cut), periodic validation (val.*) and Weights & Biases logging (log.wandb)."""
import json
import sys
import types

import pytest

from memagent.config import AgentConfig, ConfigError
from memagent.rl.config import TrainConfig, config_to_dict, load_config
from memagent.rl.distributed import DistInfo
from memagent.rl.recipe import MetricsLog
from memagent.rl.samples import QASample, cap_chunks, middle_cut
from memagent.rl.validation import Validator, is_val_step
from memagent.sections import build, spell_out


def test_middle_cut_keeps_head_and_tail_by_hand():
    ids = list(range(10))
    assert middle_cut(ids, 5) == [0, 1, 7, 8, 9]  # head 5 // 2 = 2, tail 3
    assert middle_cut(ids, 4) == [0, 1, 8, 9]
    assert middle_cut(ids, 10) == ids and middle_cut(ids, 99) == ids
    assert middle_cut(ids, 1) == [9]  # head 0, tail 1
    with pytest.raises(ValueError):
        middle_cut(ids, 0)


def test_cap_chunks_cuts_long_documents_to_max_chunks(tiny_tokenizer):
    tok = tiny_tokenizer
    long_doc = "".join(f"w{i:02d} " for i in range(60))
    ids = tok.encode(long_doc, add_special_tokens=False)
    assert len(ids) > 12
    short = QASample("s", "q?", "tiny", ("a",))
    blocks = QASample("b", "q?", (long_doc[:100], long_doc[100:]), ("a",))
    out = cap_chunks([short, QASample("l", "q?", long_doc, ("a",)), blocks], tok, chunk_tokens=4, max_chunks=3)
    assert out[0] is short
    want = tok.decode(middle_cut(ids, 12))  # 3 chunks x 4 tokens: the first 6 and the last 6 tokens
    assert out[1].document == want and out[2].document == want
    assert want.startswith(tok.decode(ids[:6])) and want.endswith(tok.decode(ids[-6:]))
    assert cap_chunks([blocks], tok, 4, 0)[0] is blocks  # 0 = no cap


def test_data_section_accepts_a_path_and_max_chunks_either_way_round(tmp_path):
    cfg = load_config(None, ["data=train.jsonl", "data.max_chunks=8"])
    assert (cfg.data.path, cfg.data.max_chunks) == ("train.jsonl", 8)
    assert str(cfg.data) == "train.jsonl" and bool(cfg.data) and not load_config(None, []).data
    y = tmp_path / "c.yaml"
    y.write_text("data: train.jsonl\n")
    assert load_config(y, ["data.max_chunks=2"]).data.max_chunks == 2
    y.write_text("data: {path: a.jsonl, max_chunks: 3}\n")
    both = load_config(y, ["data=b.jsonl"])
    assert (both.data.path, both.data.max_chunks) == ("b.jsonl", 3)
    again = build(TrainConfig, spell_out(TrainConfig, json.loads(json.dumps(config_to_dict(both)))))
    assert (again.data.path, again.data.max_chunks) == ("b.jsonl", 3)
    assert TrainConfig(data="x.jsonl").data.path == "x.jsonl"
    with pytest.raises(ConfigError, match="data.max_chunks"):
        load_config(None, ["data.max_chunks=-1"])
    with pytest.raises(ConfigError, match="val.data is empty"):
        load_config(None, ["val.every=5"])


def test_validation_steps():
    assert [s for s in range(1, 8) if is_val_step(s, 3)] == [3, 6]
    assert not any(is_val_step(s, 0) for s in range(1, 8))


def test_validator_counts_greedy_and_sampled_answers(tiny_tokenizer):
    from fakes import ScriptedBackend

    backend = ScriptedBackend(tiny_tokenizer, lambda prompt, call: "so \\boxed{7}")
    samples = [QASample(str(i), "which number?", "the number is seven.", (a,)) for i, a in enumerate("778")]
    agent = AgentConfig(chunk_tokens=64, memory_tokens=16, answer_tokens=16, temperature=1.0)
    from memagent.tasks.metrics import boxed_reward

    v = Validator(samples, every=2, agent=agent, reward_fn=boxed_reward, seed=3, info=DistInfo())
    assert v.metrics(1, backend) == {} and backend.params == []
    got = v.metrics(2, backend)
    assert got == {"val/greedy_acc": pytest.approx(2 / 3), "val/sampled_acc": pytest.approx(2 / 3)}
    temps = sorted({p.temperature for p in backend.params})
    assert temps == [0.0, 1.0]
    seeds = [p.seed for p in backend.params]
    backend.params.clear()
    v.metrics(2, backend)
    assert [p.seed for p in backend.params] == seeds  # the same step validates the same way (resume-safe)


@pytest.mark.parametrize("per_sample", [False, True])
def test_validator_keys_each_question_by_its_global_index_under_per_sample_seeding(monkeypatch, per_sample):
    import memagent.rl.validation as validation

    calls = []

    def fake(backend, agent, samples, reward_fn, *, temperature, seed, keys=None):
        calls.append(([s.id for s in samples], temperature, keys))
        return 0

    monkeypatch.setattr(validation, "correct_answers", fake)
    monkeypatch.setattr(validation, "all_reduce", lambda t, info, op="sum": t)  # rank 1 of 2, no process group
    samples = [QASample(str(i), "which number?", "seven.", ("7",)) for i in range(5)]
    agent = AgentConfig(chunk_tokens=64, memory_tokens=16, answer_tokens=16, temperature=1.0)
    v = Validator(samples, every=1, agent=agent, reward_fn=None, seed=3, info=DistInfo(rank=1, world_size=2),
                  per_sample=per_sample)
    v.metrics(1, None)
    keys = [1, 3] if per_sample else None  # questions 1 and 3 are rank 1's; sampled with their own keys
    assert calls == [(["1", "3"], 0.0, None), (["1", "3"], 1.0, keys)]


def test_keyed_validation_samples_a_question_alike_in_any_company(tiny_tokenizer):
    """correct_answers with keys: a question's sampled prompts carry seeds from its key alone."""
    from fakes import ScriptedBackend

    from memagent.agent.scheduler import keyed_call_seed
    from memagent.rl.validation import correct_answers
    from memagent.tasks.metrics import boxed_reward

    backend = ScriptedBackend(tiny_tokenizer, lambda prompt, call: "so \\boxed{7}")
    samples = [QASample(str(i), "which number?", "the number is seven.", ("7",)) for i in range(3)]
    agent = AgentConfig(chunk_tokens=64, memory_tokens=16, answer_tokens=16, temperature=1.0)
    got = correct_answers(backend, agent, samples, boxed_reward, temperature=1.0, seed=5, keys=[4, 9, 2])
    assert got == 3
    seeds = [s for p in backend.params for s in (p.seeds or ())]
    assert seeds and set(seeds) <= {keyed_call_seed(5, key, k) for key in (4, 9, 2) for k in (1, 2, 3)}
    assert {keyed_call_seed(5, 9, 1)} <= set(seeds)


@pytest.mark.slow
def test_training_writes_validation_at_its_steps_and_resume_repeats_them(tmp_path):
    from test_rl_trainer import fresh_model, samples, small_config, symbol_reward

    from memagent.backends.tiny import build_tokenizer
    from memagent.rl.trainer import train

    tok = build_tokenizer(vocab_size=1024)
    val = tmp_path / "val.jsonl"
    val.write_text("".join(json.dumps({"id": f"v{i}", "question": f"value of key {i}?", "context": f"key {i} is {i}.",
                                       "answers": [str(i)]}) + "\n" for i in range(5)))
    extra = ["val.every=2", f"val.data={val}", "val.samples=4", "rollout.batch_size=2", "update.mini_batch_size=2",
             "rollout.group_size=2"]
    full = train(small_config(tmp_path / "a", "total_steps=4", *extra), samples(8), symbol_reward,
                 model=fresh_model(tok), tokenizer=tok)
    for rec in full.metrics:
        has = "val/greedy_acc" in rec
        assert has == (rec["step"] % 2 == 0), rec["step"]
        if has:
            assert 0 <= rec["val/greedy_acc"] <= 1 and 0 <= rec["val/sampled_acc"] <= 1
            assert rec["val/greedy_acc"] * 4 == round(rec["val/greedy_acc"] * 4)  # 4 questions
    lines = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert [("val/greedy_acc" in r) for r in lines] == [False, True, False, True]
    train(small_config(tmp_path / "b", "total_steps=2", *extra), samples(8), symbol_reward,
          model=fresh_model(tok), tokenizer=tok)
    resumed = train(small_config(tmp_path / "b", "total_steps=4", "resume=true", *extra), samples(8), symbol_reward,
                    model=fresh_model(tok), tokenizer=tok)
    for key in ("val/greedy_acc", "val/sampled_acc"):
        assert resumed.metrics[-1][key] == full.metrics[-1][key]


class FakeRun:
    def __init__(self, kwargs):
        self.kwargs, self.logged, self.finished = kwargs, [], False

    def log(self, data, step):
        self.logged.append((step, data))

    def finish(self):
        self.finished = True


@pytest.fixture
def fake_wandb(monkeypatch):
    mod = types.ModuleType("wandb")
    mod.runs = []
    mod.util = types.SimpleNamespace(generate_id=lambda: f"id{len(mod.runs)}")

    def init(**kwargs):
        mod.runs.append(FakeRun(kwargs))
        return mod.runs[-1]

    mod.init = init
    monkeypatch.setitem(sys.modules, "wandb", mod)
    return mod


def test_wandb_gets_every_numeric_metric_and_a_resumed_run_continues_its_id(fake_wandb, tmp_path):
    opts = {"wandb": True, "project": "memagent-runs", "name": "", "entity": ""}
    log = MetricsLog(tmp_path / "run", DistInfo(), resume_step=0, wandb=opts, config={"seed": 3})
    log.write({"step": 1, "reward": 0.5, "note": "text", "val/greedy_acc": 0.25})
    log.close()
    run = fake_wandb.runs[0]
    assert run.kwargs["project"] == "memagent-runs" and run.kwargs["name"] == "run"
    assert run.kwargs["id"] == "id0" and run.kwargs["resume"] == "allow" and run.kwargs["config"] == {"seed": 3}
    assert run.logged == [(1, {"reward": 0.5, "val/greedy_acc": 0.25})] and run.finished
    MetricsLog(tmp_path / "run", DistInfo(), resume_step=1, wandb=opts).close()
    assert fake_wandb.runs[1].kwargs["id"] == "id0"  # resumed: the same W&B run
    MetricsLog(tmp_path / "run", DistInfo(), resume_step=0, wandb=opts).close()
    assert fake_wandb.runs[2].kwargs["id"] == "id2"  # a fresh run: a new one
    MetricsLog(tmp_path / "r1", DistInfo(rank=1, world_size=2), wandb=opts).close()
    assert len(fake_wandb.runs) == 3  # only rank 0 logs


def test_wandb_missing_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ConfigError, match="pip install 'memagent\\[wandb\\]'"):
        MetricsLog(tmp_path, DistInfo(), wandb={"wandb": True})


def test_training_reads_at_most_max_chunks_per_context(tmp_path):
    from test_rl_trainer import fresh_model, samples, small_config, symbol_reward

    from memagent.backends.tiny import build_tokenizer
    from memagent.rl.trainer import train

    tok = build_tokenizer(vocab_size=1024)
    extra = ["total_steps=1", "rollout.batch_size=2", "update.mini_batch_size=2", "rollout.group_size=2"]
    data = [dict(s, document=" ".join([s["document"]] * 4)) for s in samples(4)]
    whole = train(small_config(tmp_path / "a", *extra), data, symbol_reward, model=fresh_model(tok), tokenizer=tok)
    cut = train(small_config(tmp_path / "b", *extra, "data.max_chunks=2"), data, symbol_reward,
                model=fresh_model(tok), tokenizer=tok)
    assert whole.metrics[0]["conversations_per_sample"] > 4  # the documents span more than 3 chunks of 12 tokens
    assert cut.metrics[0]["conversations_per_sample"] == 3  # 2 memory updates + the final answer
