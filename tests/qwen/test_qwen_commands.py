"""The commands on the real Qwen vocabulary and chat template: `memagent ask` and `memagent serve` over the
scripted tiny Qwen3 (tests/qwen_fixture.py: greedy, it answers \\boxed{Paris}), one `memagent train` step on it,
and the token lengths `memagent data ruler-hqa --tokenizer <Qwen>` records (the paper's lengths are Qwen
tokens: 50 documents of HotpotQA are about 7K)."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from qwen_fixture import ANSWER, REPLY_PLAIN

sys.path.insert(0, str(Path(__file__).parents[1] / "serve"))  # tests/serve/serve_helpers.py
from serve_helpers import free_port, wait_up  # noqa: E402

from memagent.agent.workflow import AgentInput, MemoryAgent  # noqa: E402
from memagent.config import AgentConfig  # noqa: E402

BUDGETS = dict(chunk_tokens=48, memory_tokens=16, answer_tokens=16, query_tokens=32)


def budget_flags(budgets: dict = BUDGETS) -> list[str]:
    return [x for k, v in budgets.items() for x in (f"--{k.replace('_', '-')}", str(v))]


def document(n: int = 120) -> str:
    words = "the river Paris city capital of France is on the Seine and its café 東京 12345".split()
    return " ".join(words[(i * 7) % len(words)] for i in range(n))


# -- ask --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("thinking", [True, False])
def test_ask_end_to_end_on_the_qwen_vocab_model(run_cli, qwen_model_dir, qwen_tokenizer, tmp_path, thinking):
    """The answer, and a trace whose chunks are exact 48-token pieces of the document in Qwen tokens; with a
    profile's enable_thinking false the replies hold no think block (nothing to strip)."""
    doc = tmp_path / "doc.txt"
    doc.write_text(document(), encoding="utf-8")
    n_tokens = len(qwen_tokenizer(document(), add_special_tokens=False)["input_ids"])
    args = ["ask", "--model", qwen_model_dir, "--device", "cpu", "--dtype", "float32", "--document", doc,
            "--question", "What is the capital of France?", "--trace", tmp_path / "t.jsonl", *budget_flags()]
    if not thinking:
        (tmp_path / "p.yaml").write_text("chat_template_kwargs: {enable_thinking: false}\n", encoding="utf-8")
        args += ["--profile", tmp_path / "p.yaml"]
    code, out, err = run_cli(*args)
    assert code == 0, err
    assert out.strip() == ANSWER
    records = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    memory = [r for r in records if r.get("kind") != "final"]
    assert len(memory) == math.ceil(n_tokens / 48)
    assert [r["chunk_tokens"] for r in memory] == [48] * (len(memory) - 1) + [n_tokens - 48 * (len(memory) - 1)]
    assert [r["chunk_start"] for r in memory] == [48 * k for k in range(len(memory))]
    assert {r["memory"] for r in memory} == {REPLY_PLAIN}
    assert {r["think_removed"] for r in records} == {thinking}


# -- serve ------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_serve_answers_a_chat_request_with_the_qwen_vocab_model(qwen_model_dir, qwen_backend, tmp_path):
    """`memagent serve --model <dir>` in a child process, one OpenAI-shaped chat request: the answer and the
    call count of the same run in process."""
    pytest.importorskip("uvicorn")
    pytest.importorskip("fastapi")
    doc, question = document(), "What is the capital of France?"
    ref = MemoryAgent(qwen_backend, AgentConfig(**BUDGETS)).run([AgentInput(question, doc)])[0]
    port = free_port()
    src = Path(__file__).resolve().parents[2] / "src"
    env = dict(os.environ, PYTHONPATH=f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "memagent.cli", "serve", "--model", str(qwen_model_dir), "--state-dir",
           str(tmp_path / "state"), "--port", str(port), "--device", "cpu", "--dtype", "float32", "--max-jobs", "1",
           *budget_flags()]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_up(url, timeout=120, proc=proc)
        r = httpx.post(url + "/v1/chat/completions", timeout=120, json={"model": "m", "messages": [
            {"role": "system", "content": doc}, {"role": "user", "content": question}]})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["choices"][0]["message"]["content"] == ref.answer == ANSWER
        assert body["choices"][0]["finish_reason"] == "stop"
        assert body["usage"]["calls"] == ref.num_chunks + 1 >= 3
    finally:
        proc.terminate()
        proc.wait(30)


# -- train ------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_one_training_step_on_the_qwen_vocab_model(run_cli, qwen_model_dir, tmp_path):
    """`memagent train` with configs/rl/tiny.yaml's settings, one step. At temperature 1 the scripted model
    leaves its reply with probability ~4.4% a token, so groups get both rewards and the update moves weights."""
    from safetensors.torch import load_file

    from memagent.backends.hf import TransformersBackend
    from memagent.rl.rollout import generate_rollouts
    from memagent.rl.samples import load_samples
    from memagent.tasks.metrics import sub_em

    rows = [{"id": str(i), "question": "What is the capital of France?", "answers": [ANSWER],
             "context": document(60 + 10 * i)} for i in range(8)]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    cfg = yaml.safe_load((Path(__file__).parents[2] / "configs/rl/tiny.yaml").read_text())
    cfg.update(out_dir=str(tmp_path / "run"), total_steps=1, save_every=1, progress=False)
    cfg["agent"].update(chunk_tokens=48, memory_tokens=16, answer_tokens=16)
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(cfg), encoding="utf-8")
    code, out, err = run_cli("train", tmp_path / "tiny.yaml", f"model={qwen_model_dir}", f"data={data}")
    assert code == 0, err
    assert "trained 1 step(s)" in out
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 1 and 0 < metrics[0]["reward"] < 1
    before = load_file(str(qwen_model_dir / "model.safetensors"))
    after = load_file(str(next((tmp_path / "run").rglob("model.safetensors"))))
    assert set(after) == set(before)
    assert any(not (before[k] == after[k]).all() for k in before)
    # the rows the step trains on: Qwen3 generation prompts in, <|im_end|>-terminated replies out
    backend = TransformersBackend.from_pretrained(qwen_model_dir, device="cpu", dtype="float32", want_logprobs=True)
    batch = generate_rollouts(backend, AgentConfig(**BUDGETS, temperature=1.0), load_samples(rows[:2]), [0, 1], 4,
                              lambda p, g: sub_em(p, g), seed=0)
    assert all(p[-3:] == [151644, 77091, 198] for p in batch.prompt_ids)  # <|im_start|> assistant \n
    stopped = [r for r in batch.response_ids if r[-1] == 151645]
    assert stopped and all(151643 not in r for r in batch.response_ids)
    assert {p for p in batch.predictions} <= {ANSWER, None}


def test_training_rollouts_render_with_the_profiles_chat_template_kwargs(qwen_backend, qwen_tokenizer, tmp_path):
    """`memagent train --profile P` writes P's chat_template_kwargs into out_dir/profile.yaml, so the rollouts
    render with them (Qwen3 with enable_thinking false: the empty think block), as `ask` and `eval` do
    (`TrainConfig.chat_template_kwargs`; a known gap until it was added, then an xfail here)."""
    from memagent.protocol.profile import Profile, training_profile
    from memagent.rl.config import build_train_config
    from memagent.rl.distributed import DistInfo
    from memagent.rl.rollout import PolicyRollout

    profile = Profile(chat_template_kwargs={"enable_thinking": False})
    cfg = build_train_config(None, [f"out_dir={tmp_path / 'run'}", "progress=false"], profile=profile)
    assert training_profile(cfg, profile)["chat_template_kwargs"] == {"enable_thinking": False}
    rollout = PolicyRollout(qwen_backend.model, qwen_tokenizer, cfg, DistInfo())
    assert rollout.backend().render("hi").endswith("<think>\n\n</think>\n\n")
    assert cfg.chat_template_kwargs == {"enable_thinking": False}
    plain = build_train_config(None, [f"out_dir={tmp_path / 'run2'}", "progress=false"])
    assert not PolicyRollout(qwen_backend.model, qwen_tokenizer, plain, DistInfo()).backend().render("hi").endswith(
        "</think>\n\n")


# -- data ruler-hqa ---------------------------------------------------------------------------------------------
def test_ruler_hqa_lengths_are_qwen_token_counts(run_cli, qwen_dir, qwen_tokenizer, hotpot_file, tmp_path):
    """With --tokenizer <Qwen> each sample records num_tokens, the Qwen token count of its context exactly,
    and a --tokens target is met within the 2% tolerance in Qwen tokens. Measured on the fixture (6-word
    sentences): 50 documents are 1,351-1,382 Qwen tokens (~27 a document; HotpotQA's ~140 give the paper's ~7K)."""
    def count(text):
        return len(qwen_tokenizer(text, add_special_tokens=False)["input_ids"])

    out = tmp_path / "hqa.jsonl"
    code, _, err = run_cli("data", "ruler-hqa", "--source", hotpot_file, "--num-docs", "50,100", "--samples", "8",
                           "--tokenizer", qwen_dir, "--out", out)
    assert code == 0, err
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["num_docs"] for r in recs] == [50] * 8 + [100] * 8
    assert all(r["tokens_exact"] and r["tokenizer"] == str(qwen_dir) for r in recs)
    assert [r["num_tokens"] for r in recs] == [count(r["context"]) for r in recs]
    fifty = [r["num_tokens"] for r in recs[:8]]
    assert 1300 <= min(fifty) and max(fifty) <= 1400
    out2 = tmp_path / "hqa-tokens.jsonl"
    code, _, err = run_cli("data", "ruler-hqa", "--source", hotpot_file, "--tokens", "2000", "--samples", "8",
                           "--tokenizer", qwen_dir, "--out", out2)
    assert code == 0, err
    recs = [json.loads(line) for line in out2.read_text().splitlines()]
    assert [r["num_tokens"] for r in recs] == [count(r["context"]) for r in recs]
    assert all(abs(r["num_tokens"] - 2000) <= 0.02 * 2000 for r in recs)


def test_lazy_ruler_hqa_counts_overshoot_qwen_by_one_token_a_separator(qwen_tokenizer, hotpot_file):
    """Samples of 10,000+ documents record a block-wise estimate (tokens_exact false): header, paragraph and the
    "\\n\\n" separator counted apart. Qwen's pre-tokeniser joins a paragraph's final "." with the "\\n\\n" after
    it (one token ".\\n\\n"), so the estimate is over by one token per separator: 49 of 1,362 (3.6%) for 50
    fixture documents, above the 2% the --tokens targets allow (a known defect, reported; lazy_threshold=50
    stands in for 10,000 here). Held: never under the exact count, at most one token a separator over."""
    from memagent.tasks.documents import render_documents
    from memagent.tasks.ruler_hqa import load_hotpotqa, synthesize_ruler_hqa

    corpus = load_hotpotqa(str(hotpot_file))
    for s in synthesize_ruler_hqa(corpus, samples=4, seed=0, num_docs=[50], tokenizer=qwen_tokenizer,
                                  tokenizer_name="qwen", lazy_threshold=50):
        ids = s["lazy"]["doc_ids"]
        exact = len(qwen_tokenizer(render_documents([corpus.paragraphs[i] for i in ids]),
                                   add_special_tokens=False)["input_ids"])
        assert s["tokens_exact"] is False
        assert 0 <= s["num_tokens"] - exact <= len(ids) - 1
