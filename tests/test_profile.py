"""Protocol profiles: load, validate, override, write; the project's profile file equals the built-in one."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from memagent.config import AgentConfig, ConfigError
from memagent.eval.scoring import ScoreOptions
from memagent.protocol.profile import (
    Profile, dump_profile, load_profile, make_profile, profile_from_dict, resolve_values,
    training_profile, write_profile,
)

ROOT = Path(__file__).resolve().parents[1]


def test_the_project_profile_file_equals_the_built_in_defaults():
    assert load_profile(ROOT / "configs/profiles/memagent.yaml") == Profile()
    # and the built-in profile is AgentConfig's defaults
    assert Profile().agent_config() == AgentConfig()


def test_a_partial_file_keeps_the_other_settings(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("sampling: {temperature: 0.7, top_p: 0.95, repeats: 3}\nscoring: {golds: first}\n"
                    "chat_template_kwargs: {enable_thinking: false}\nbudgets: {yarn_factor: 4}\n")
    p = load_profile(path)
    assert (p.sampling.temperature, p.sampling.top_p, p.sampling.repeats, p.sampling.seed) == (0.7, 0.95, 3, None)
    assert p.scoring == ScoreOptions(golds="first", empty="zero", failed="wrong")
    assert p.chat_template_kwargs == {"enable_thinking": False}
    assert p.budgets.yarn_factor == 4.0 and isinstance(p.budgets.yarn_factor, float)
    assert p.prompts == Profile().prompts and p.budgets.chunk_tokens == 5000
    cfg = p.agent_config(max_batch_docs=3)
    assert (cfg.temperature, cfg.top_p, cfg.max_batch_docs) == (0.7, 0.95, 3)


@pytest.mark.parametrize(
    "text, message",
    [
        ("samplin: {}", "unknown key(s) samplin; valid keys: name, prompts, sampling, budgets, scoring"),
        ("sampling: {temp: 1}", "unknown key(s) sampling.temp; valid keys of sampling: temperature, top_p, seed, repeats"),
        ("budgets: {chunk_tokens: 5000.5}", "budgets.chunk_tokens must be an integer"),
        ("budgets: {chunk_tokens: '5000'}", "budgets.chunk_tokens must be an integer"),
        ("budgets: {memory_tokens: true}", "budgets.memory_tokens must be an integer"),
        ("budgets: {chunk_tokens: null}", "budgets.chunk_tokens must not be null"),
        ("sampling: {temperature: .nan}", "sampling.temperature must be a finite number"),
        ("sampling: {top_p: .inf}", "sampling.top_p must be a finite number"),
        ("sampling: {top_p: 1.5}", "top_p must be in (0, 1]"),
        ("sampling: {repeats: 0}", "sampling.repeats must be a positive integer"),
        ("scoring: {golds: some}", "scoring.golds must be one of all, first"),
        ("prompts: {answer_protocol: json}", "answer_protocol must be one of boxed, phrase"),
        ("prompts: {think: drop}", "think must be one of strip, keep"),
        ("prompts: {final_template: 'no fields'}", "final template lacks the placeholder"),
        ("prompts: {baseline_template: 'Q {question}'}", "baseline template must contain {context}"),
        ("budgets: {yarn_factor: 1.0}", "yarn_factor must be a finite number > 1"),
        ("budgets: {baseline_window: 0}", "budgets.baseline_window must be a positive integer"),
        ("chat_template_kwargs: [1]", "chat_template_kwargs must be a mapping"),
        ("- a list", "must be a mapping"),
        ("sampling: [1]", "sampling must be a mapping"),
        ("a: [unclosed", "is not valid YAML"),
    ],
)
def test_bad_profiles_are_refused_with_the_reason(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text + "\n")
    with pytest.raises(ConfigError) as e:
        load_profile(path)
    assert message in str(e.value)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="nope.yaml does not exist"):
        load_profile(tmp_path / "nope.yaml")


def test_flags_override_the_file_and_unset_flags_do_not(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("sampling: {temperature: 0.7, top_p: 0.95}\nbudgets: {memory_tokens: 512, baseline_window: 9000}\n")
    p = make_profile(*resolve_values(path, temperature=0.0, top_p=None, seed=5, memory_tokens=None, window=100))
    assert (p.sampling.temperature, p.sampling.top_p, p.sampling.seed) == (0.0, 0.95, 5)
    assert (p.budgets.memory_tokens, p.budgets.baseline_window) == (512, 100)
    assert make_profile(*resolve_values(None)) == Profile()
    with pytest.raises(ConfigError, match="no profile setting for flag 'colour'"):
        resolve_values(None, colour=1)
    with pytest.raises(ConfigError, match="command-line flags: .*top_p must be in"):
        resolve_values(None, top_p=2.0)


def test_written_profiles_read_back_equal_templates_with_trailing_spaces_included(tmp_path):
    p = profile_from_dict({
        "name": "x",
        "prompts": {"memory_template": "<q> \n{question}\n{memory}\n{chunk} ", "final_template": "{question}{memory}\n",
                    "baseline_template": "{context}\n\\boxed{{}} {question}", "answer_protocol": "phrase"},
        "sampling": {"seed": 3, "repeats": 2}, "scoring": {"failed": "skip", "empty": "text"},
        "chat_template_kwargs": {"enable_thinking": False, "depth": 2},
    })
    written = write_profile(p, tmp_path)  # a folder: profile.yaml inside
    assert written == tmp_path / "profile.yaml"
    assert load_profile(written) == p
    assert yaml.safe_load(dump_profile(p))["prompts"]["memory_template"] == "<q> \n{question}\n{memory}\n{chunk} "


def test_train_takes_the_profile_prompts_and_budgets_but_keeps_its_sampling():
    from memagent.rl.config import build_train_config

    overrides = ["agent.memory_tokens=64", "agent.temperature=0.9"]  # explicit agent.* overrides win
    prof = profile_from_dict({"budgets": {"memory_tokens": 512, "chunk_tokens": 800},
                              "sampling": {"temperature": 0.0}, "prompts": {"answer_protocol": "phrase"}})
    new = build_train_config(None, overrides, profile=prof)  # memagent train's own path
    resolved = training_profile(new, prof)
    assert (new.agent.memory_tokens, new.agent.chunk_tokens, new.agent.answer_protocol) == (64, 800, "phrase")
    assert new.agent.temperature == 0.9  # rollouts sample at the training config's temperature
    assert (resolved["budgets"].memory_tokens, resolved["sampling"].temperature) == (64, 0.9)
    plain = build_train_config(None, overrides)
    assert plain.agent.chunk_tokens != 800 and training_profile(plain, None)["budgets"].memory_tokens == 64


def test_the_scoring_and_repeats_flags_map_to_their_sections():
    p = make_profile(*resolve_values(None, golds="first", empty_prediction="text", failed="skip", repeats=3))
    assert p.scoring == ScoreOptions(golds="first", empty="text", failed="skip") and p.sampling.repeats == 3
