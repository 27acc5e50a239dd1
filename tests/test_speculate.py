"""Prompt-lookup speculative decoding (--speculate ngram): the drafts, what is kept, exactness against plain
decoding on a tiny model, the vLLM config, the flag's plumbing. The real model: tests/test_speculate_real.py."""
from __future__ import annotations

import dataclasses
import json

import pytest

from memagent.backends.base import Generation, SamplingParams
from memagent.backends.options import BackendOptions
from memagent.backends.speculate import accept, check_speculate, lookup_draft, vllm_speculative_config
from memagent.config import ConfigError
from memagent.errors import InputError


# -- the draft and the rule of what is kept (hand-worked) ---------------------------------------------------
def test_the_draft_follows_the_latest_earlier_occurrence_of_the_longest_suffix():
    assert lookup_draft([5, 6, 7, 8, 9, 5, 6], num_draft=2) == [7, 8]  # bigram [5, 6] at 0: 7, 8 follow it
    # [1, 2] occurs at 0 (then 3) and at 4 (then 9): the latest wins
    assert lookup_draft([1, 2, 3, 0, 1, 2, 9, 1, 2], num_draft=3) == [9, 1, 2]
    # the trigram [7, 1, 2] occurs at 0 (then 4): longer suffixes win over the later bigram [1, 2] at 4
    assert lookup_draft([7, 1, 2, 4, 1, 2, 5, 7, 1, 2], num_draft=1, max_ngram=3) == [4]
    assert lookup_draft([7, 1, 2, 4, 1, 2, 5, 7, 1, 2], num_draft=1, max_ngram=2) == [5]
    assert lookup_draft([3, 4, 5], num_draft=4) == []  # 5 never occurred before
    assert lookup_draft([3, 3], num_draft=4) == [3]  # what follows the match runs up to the end of the sequence
    assert lookup_draft([1, 2, 1], num_draft=0) == [] and lookup_draft([], num_draft=3) == []


def test_accept_keeps_the_matching_prefix_and_the_models_next_token():
    assert accept([4, 5, 6], [4, 5, 9, 7]) == [4, 5, 9]  # 2 drafts accepted, the model's 9 replaces the 6
    assert accept([4, 5, 6], [4, 5, 6, 7]) == [4, 5, 6, 7]  # all accepted, plus the bonus token
    assert accept([4, 5, 6], [8, 5, 6, 7]) == [8]  # none accepted: one token, as plain decoding
    assert accept([], [8]) == [8]


def test_the_method_names_and_the_vllm_config():
    assert check_speculate(None) == "none" and check_speculate("ngram") == "ngram"
    with pytest.raises(ValueError, match="none, ngram"):
        check_speculate("eagle")
    assert vllm_speculative_config("none") is None
    assert vllm_speculative_config("ngram") == {"method": "ngram", "num_speculative_tokens": 10,
                                                "prompt_lookup_max": 3, "prompt_lookup_min": 1}


# -- exactness on the tiny model ----------------------------------------------------------------------------
PROMPTS = ["the key of the city is river. the key of the city is river. the key of the",
           "memory: alpha beta gamma delta. chunk: alpha beta gamma delta alpha beta",
           "a b c d e f a b c d e f a b c", "value 7 value 7 value 7 value"]


def _pair(tiny_backend, **kw):
    from memagent.backends.hf import TransformersBackend

    plain = TransformersBackend(tiny_backend.model, tiny_backend.tokenizer, **kw)
    spec = TransformersBackend(tiny_backend.model, tiny_backend.tokenizer, speculate="ngram", **kw)
    return plain, spec


def test_greedy_speculation_gives_plain_decodings_tokens(tiny_backend):
    plain, spec = _pair(tiny_backend)
    p = SamplingParams(max_new_tokens=24)
    a, b = plain.generate(PROMPTS, p), spec.generate(PROMPTS, p)
    for x, y in zip(a, b):
        assert y.token_ids == x.token_ids and y.text == x.text and y.finish_reason == x.finish_reason
        assert y.prompt_token_ids == x.prompt_token_ids
        assert x.draft_proposed is None and 0 <= y.draft_accepted <= y.draft_proposed
    assert sum(g.draft_proposed for g in b) > 0 and sum(g.draft_accepted for g in b) > 0  # drafts were verified


def test_per_row_seeded_sampling_keeps_its_tokens_and_logprobs_are_the_replies(tiny_backend):
    plain, spec = _pair(tiny_backend, want_logprobs=True)
    p = SamplingParams(max_new_tokens=16, temperature=1.0, seed=5, seeds=(11, 12, 13, 14))
    a, b = plain.generate(PROMPTS, p), spec.generate(PROMPTS, p)
    assert [g.token_ids for g in b] == [g.token_ids for g in a]
    for x, y in zip(a, b):
        assert y.logprobs == pytest.approx(x.logprobs, abs=1e-5)


def test_unseeded_rows_sample_reproducibly_from_the_seed(tiny_backend):
    _, spec = _pair(tiny_backend)
    p = SamplingParams(max_new_tokens=12, temperature=1.0, seed=3)
    a, b = spec.generate(PROMPTS, p), spec.generate(PROMPTS, p)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert all(0 < len(g.token_ids) <= 12 for g in a)


def test_a_generation_config_rule_speculation_would_skip_is_refused(tiny_backend):
    from memagent.backends.base import BackendError
    from memagent.backends.hf import TransformersBackend

    model = tiny_backend.model
    old = model.generation_config.repetition_penalty
    model.generation_config.repetition_penalty = 1.3
    try:
        with pytest.raises(BackendError, match="repetition_penalty=1.3"):
            TransformersBackend(model, tiny_backend.tokenizer, speculate="ngram")
        TransformersBackend(model, tiny_backend.tokenizer)  # plain decoding applies it: fine
    finally:
        model.generation_config.repetition_penalty = old
    with pytest.raises(BackendError, match="unknown speculation method 'eagle'"):
        TransformersBackend(model, tiny_backend.tokenizer, speculate="eagle")


# -- the option on every path ---------------------------------------------------------------------------------
def test_backend_options_pass_it_to_transformers_and_vllm_and_refuse_it_for_openai():
    assert BackendOptions(speculate="ngram").kwargs()["speculate"] == "ngram"
    assert "speculate" not in BackendOptions().kwargs() and "speculate" not in BackendOptions(speculate="none").kwargs()
    kw = BackendOptions(name="vllm", speculate="ngram").kwargs()
    assert kw["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 10, "prompt_lookup_max": 3,
                                        "prompt_lookup_min": 1}
    assert "speculative_config" not in BackendOptions(name="vllm").kwargs()
    refused = r"--speculate ngram \(or a profile.s speculate: ngram\) is for --backend transformers or vllm"
    with pytest.raises(InputError, match=refused):
        BackendOptions(name="openai", base_url="http://127.0.0.1:9/v1", speculate="ngram")


def test_the_profile_sets_it_and_the_flag_wins(monkeypatch):
    from memagent.protocol.profile import Profile, open_backend, profile_from_dict

    assert Profile().speculate == "none" and profile_from_dict({"speculate": "ngram"}).speculate == "ngram"
    with pytest.raises(ConfigError, match="speculate: unknown speculation method 'fast'"):
        profile_from_dict({"speculate": "fast"})
    seen = []
    monkeypatch.setattr("memagent.backends.load_backend", lambda name, model, **kw: seen.append(kw))
    open_backend("m", BackendOptions(), Profile(speculate="ngram"))
    open_backend("m", BackendOptions(speculate="none"), Profile(speculate="ngram"))
    open_backend("m", BackendOptions(speculate="ngram"), Profile())
    assert [kw.get("speculate") for kw in seen] == ["ngram", None, "ngram"]


def test_training_rollouts_take_it_except_from_an_external_server():
    from memagent.rl.config import RolloutConfig

    assert RolloutConfig().speculate == "none" and RolloutConfig(speculate="ngram").speculate == "ngram"
    with pytest.raises(ConfigError, match="an external vLLM server speculates as it was started"):
        RolloutConfig(engine="vllm-server", speculate="ngram")
    with pytest.raises(ConfigError):
        RolloutConfig(speculate="eagle")


def test_the_policy_rollout_engine_speculates_when_asked(tiny_backend):
    from memagent.rl.config import RolloutConfig, TrainConfig
    from memagent.rl.distributed import DistInfo
    from memagent.rl.rollout import PolicyRollout

    cfg = TrainConfig(rollout=RolloutConfig(speculate="ngram"))
    be = PolicyRollout(tiny_backend.model, tiny_backend.tokenizer, cfg, DistInfo()).backend()
    assert be.speculate == "ngram"
    g = be.generate(PROMPTS[:1], SamplingParams(max_new_tokens=8, temperature=1.0, seed=0))[0]
    assert g.draft_proposed is not None
    plain = PolicyRollout(tiny_backend.model, tiny_backend.tokenizer, TrainConfig(), DistInfo()).backend()
    assert plain.speculate == "none"


def test_ask_with_openai_and_speculate_is_one_error_line_before_any_call(run_cli, tmp_path, openai_server):
    doc = tmp_path / "doc.txt"
    doc.write_text("the key is 7. " * 20)
    out = tmp_path / "out.jsonl"
    code, stdout, err = run_cli("ask", "--backend", "openai", "--base-url", openai_server.url, "--model", "tiny",
                                "--speculate", "ngram", "--question", "what is the key?", "--document", str(doc),
                                "--output", str(out))
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: --speculate ngram (or a profile")
    assert sum(openai_server.attempts.values()) == 0 and not out.exists()


def test_traces_record_draft_tokens_per_call(tiny_backend, tmp_path):
    from memagent.agent.protocol import AgentInput
    from memagent.agent.registry import build_workflow
    from memagent.backends.hf import TransformersBackend
    from memagent.config import AgentConfig

    cfg = AgentConfig(chunk_tokens=16, memory_tokens=8, answer_tokens=8, query_tokens=32)
    rows = {}
    for method in ("none", "ngram"):
        be = TransformersBackend(tiny_backend.model, tiny_backend.tokenizer, speculate=method)
        trace = tmp_path / f"{method}.jsonl"
        wf = build_workflow("memagent", be, cfg, trace_path=trace)
        wf.run([AgentInput("what is the key?", "the key is 7. the city is far. " * 6, doc_id="d")])
        rows[method] = [json.loads(line) for line in trace.read_text().splitlines()]
    assert len(rows["none"]) == len(rows["ngram"]) > 2
    for a, b in zip(rows["none"], rows["ngram"]):
        assert "draft_proposed" not in a and 0 <= b["draft_accepted"] <= b["draft_proposed"]
        assert {k: v for k, v in b.items() if not k.startswith("draft_") and k != "seconds"} == \
            {k: v for k, v in a.items() if k != "seconds"}


def test_generation_fields_default_to_none():
    g = Generation("x")
    assert g.draft_proposed is None and g.draft_accepted is None
    assert dataclasses.replace(g, draft_proposed=3, draft_accepted=1).draft_accepted == 1
