"""--profile, --top-p and --seed on `ask` and `eval` end to end: the tiny model in process and behind the
loopback OpenAI server; the resolved profile is written next to the results."""
from __future__ import annotations

import json

import pytest
import yaml

from memagent.protocol.profile import Profile, load_profile


@pytest.fixture
def profile_file(tmp_path):
    path = tmp_path / "official.yaml"
    path.write_text(yaml.safe_dump({
        "name": "test-official",
        "sampling": {"temperature": 0.7, "top_p": 0.95, "seed": 11},
        "budgets": {"chunk_tokens": 40, "memory_tokens": 8, "answer_tokens": 6, "query_tokens": 32,
                    "baseline_answer_tokens": 5, "baseline_window": 120},
        "prompts": {"answer_protocol": "phrase"},
        "scoring": {"golds": "first", "failed": "skip"},
        "chat_template_kwargs": {"enable_thinking": False},
    }))
    return path


def _samples(tmp_path):
    path = tmp_path / "data.jsonl"
    rows = [dict(id=f"s{i}", task="qa", question=f"Where is key{i}?", answers=[f"place{i}", "other"],
                 context="filler words here. " * 12 + f"key{i} is in place{i}. ", metric="sub_em", length=10)
            for i in range(2)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_ask_with_a_profile_writes_it_beside_the_output_with_flags_applied(run_cli, tmp_path, tiny_model_dir,
                                                                            profile_file):
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"id": "a", "question": "q?", "context": "memory key " * 30}) + "\n")
    out = tmp_path / "answers.jsonl"
    code, _, err = run_cli("ask", "--model", tiny_model_dir, "--input", inp, "--output", out, "--profile",
                           profile_file, "--memory-tokens", 10, "--top-p", 0.5, "--no-progress")
    assert code == 0, err
    written = load_profile(tmp_path / "answers.profile.yaml")
    assert written.name == "test-official" and written.prompts.answer_protocol == "phrase"
    assert (written.budgets.memory_tokens, written.budgets.chunk_tokens) == (10, 40)  # flag over file
    assert (written.sampling.top_p, written.sampling.temperature, written.sampling.seed) == (0.5, 0.7, 11)
    assert json.loads(out.read_text())["id"] == "a"


def test_ask_sends_top_p_seed_and_template_kwargs_to_the_server(run_cli, tmp_path, tiny_model_dir, openai_server,
                                                                profile_file):
    doc = tmp_path / "doc.txt"
    doc.write_text("word " * 30)
    code, out, err = run_cli("ask", "--backend", "openai", "--base-url", openai_server.url, "--model", "tiny",
                             "--tokenizer", tiny_model_dir, "--document", doc, "--question", "q?",
                             "--profile", profile_file, "--top-p", 0.5, "--seed", 3, "--no-progress")
    assert code == 0, err
    assert "no answer: the model wrote no \"the answer is\"" in out or out.strip()
    bodies = openai_server.bodies
    assert len(bodies) >= 2 and all(b["top_p"] == 0.5 and b["temperature"] == 0.7 for b in bodies)
    assert all(b["chat_template_kwargs"] == {"enable_thinking": False} for b in bodies)
    assert len({b["seed"] for b in bodies}) == len(bodies)  # seeded, one seed per call
    assert [b["max_tokens"] for b in bodies] == [8] * (len(bodies) - 1) + [6]


def test_eval_with_a_profile_over_the_server(run_cli, tmp_path, tiny_model_dir, openai_server, profile_file):
    data, out = _samples(tmp_path), tmp_path / "run"
    code, _, err = run_cli("eval", "--backend", "openai", "--base-url", openai_server.url, "--model", "tiny",
                           "--tokenizer", tiny_model_dir, "--data", data, "--out", out, "--methods",
                           "memagent,full-context", "--profile", profile_file, "--max-retries", 0,
                           "--temperature", 0.3, "--no-progress")
    assert code == 0, err
    written = load_profile(out / "profile.yaml")
    assert (written.sampling.temperature, written.sampling.top_p) == (0.3, 0.95)  # flag over file
    assert written.scoring.golds == "first" and written.budgets.baseline_answer_tokens == 5
    bodies = openai_server.bodies
    assert all(b["temperature"] == 0.3 and b["top_p"] == 0.95 for b in bodies)
    assert all(b["chat_template_kwargs"] == {"enable_thinking": False} for b in bodies)
    baseline = [b for b in bodies if "Read the text below" in b["messages"][0]["content"]]
    assert len(baseline) == 2 and all(b["max_tokens"] == 5 for b in baseline)  # the baselines' own budget
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(records) == 4


def test_eval_writes_the_built_in_profile_without_one(run_cli, tmp_path, tiny_model_dir):
    data, out = _samples(tmp_path), tmp_path / "run"
    code, _, err = run_cli("eval", "--model", tiny_model_dir, "--data", data, "--out", out, "--methods", "memagent",
                           "--chunk-tokens", 64, "--memory-tokens", 8, "--answer-tokens", 8, "--query-tokens", 32,
                           "--device", "cpu", "--dtype", "float32", "--no-progress")
    assert code == 0, err
    expected = Profile()
    written = load_profile(out / "profile.yaml")
    assert written.prompts == expected.prompts and written.sampling == expected.sampling
    assert (written.budgets.chunk_tokens, written.budgets.memory_tokens) == (64, 8)


def test_a_bad_profile_is_one_error_line(run_cli, tmp_path, tiny_model_dir):
    bad = tmp_path / "bad.yaml"
    bad.write_text("sampling: {tempreature: 1}\n")
    code, _, err = run_cli("eval", "--model", tiny_model_dir, "--data", _samples(tmp_path), "--out", tmp_path / "o",
                           "--profile", bad, "--no-progress")
    assert code == 2 and err.startswith("error: ") and "sampling.tempreature" in err and "Traceback" not in err
    code, _, err = run_cli("ask", "--model", tiny_model_dir, "--document", bad, "--question", "q", "--backend",
                           "transformers", "--tensor-parallel", 2, "--no-progress")
    assert code == 2 and "--tensor-parallel is for --backend vllm" in err


@pytest.mark.slow
def test_train_with_a_profile_writes_the_resolved_one(run_cli, tmp_path):
    from memagent.backends.tiny import build_tiny_model, build_tokenizer

    model = build_tiny_model(tmp_path / "tiny", tokenizer=build_tokenizer(vocab_size=1024), hidden_size=32,
                             intermediate_size=64)
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "task": "keys", "question": f"key {i}?", "context": f"the key {i} is {i}.",
                                        "answers": [str(i)]}) + "\n" for i in range(4)))
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("total_steps: 1\nprogress: false\nagent: {chunk_tokens: 8, memory_tokens: 2, answer_tokens: 2}\n"
                   "rollout: {batch_size: 2, group_size: 2}\nupdate: {mini_batch_size: 2}\n")
    prof = tmp_path / "p.yaml"
    prof.write_text("budgets: {chunk_tokens: 12, memory_tokens: 3, answer_tokens: 2}\nprompts: {answer_protocol: phrase}\n"
                    "sampling: {temperature: 0.0}\n")
    out = tmp_path / "run"
    code, _, err = run_cli("train", cfg, f"model={model}", f"data={data}", f"out_dir={out}", "agent.memory_tokens=4",
                           "--profile", prof)
    assert code == 0, err[-2000:]
    written = load_profile(out / "profile.yaml")
    assert (written.budgets.chunk_tokens, written.budgets.memory_tokens) == (12, 4)  # override over profile
    assert written.prompts.answer_protocol == "phrase" and written.sampling.temperature == 1.0  # rollouts' own
    saved = json.loads((out / "config.json").read_text())["agent"]
    assert (saved["chunk_tokens"], saved["memory_tokens"], saved["answer_protocol"]) == (12, 4, "phrase")
