"""`memagent ask --backend vllm`: the real model in vLLM's in-process engine (CPU build), greedy, equal call for call
to `--backend transformers` (every memory, cut flag, answer), with stdout holding only what memagent writes."""
from __future__ import annotations

import pytest
from vllm_cases import ENGINE_FLAGS, ask, calls, results

pytestmark = pytest.mark.slow


def test_in_process_engine_equals_transformers_call_for_call(real_model_dir, docs_file, transformers_run, tmp_path,
                                                             vllm_env):
    want_answers, want_trace = transformers_run
    got_answers, got_trace = ask(real_model_dir, docs_file, tmp_path / "vllm", "--backend", "vllm", *ENGINE_FLAGS,
                                 env=vllm_env)
    assert len(want_trace) == 9 and sum(r.get("kind") == "final" for r in want_trace) == 3  # 2 chunks + answer, x3
    assert any(r.get("truncated") for r in want_trace)  # memories cut at M tokens: the cut flag is compared too
    assert calls(got_trace) == calls(want_trace)
    assert results(got_answers) == results(want_answers)
