"""Rewards by name: built-ins, registered, entry points; `reward:` / `step_reward:` in the training config and the
profile; an unknown name lists the valid ones (one error line, exit 2)."""
import dataclasses

import pytest
from plugin_dist import write_dist_info

from memagent.config import ConfigError
from memagent.rewards import registry
from memagent.rewards.protocol import Answered, Reward, Update
from memagent.rewards.registry import (UnknownReward, as_outcome_reward, build_reward, register_reward,
                                       reward_names, unregister_reward)
from memagent.rl.config import TrainConfig, build_train_config, load_config


def test_built_ins_and_metrics_are_rewards_of_their_kind():
    names = reward_names()
    for n in ("boxed", "em", "f1", "sub_em", "judge", "evidence", "answer-recall", "answer-likelihood"):
        assert n in names
    boxed = build_reward("boxed", "outcome")
    assert isinstance(boxed, Reward) and boxed.kind == "outcome"
    assert boxed.score([Answered("q", "so \\boxed{ Paris }", ("paris",)), Answered("q", "Paris", ("paris",))]) == [1.0, 0.0]
    assert build_reward("sub_em").score([Answered("q", "in Paris, France", ("Paris",))]) == [1.0]
    assert build_reward("evidence", "step").kind == "step"
    with pytest.raises(UnknownReward, match="'evidence' is a step reward, not an outcome reward; outcome rewards: "):
        build_reward("evidence", "outcome")
    with pytest.raises(UnknownReward, match="unknown reward 'nope'; valid rewards: answer-likelihood, answer-recall, boxed"):
        build_reward("nope")
    with pytest.raises(UnknownReward, match="takes no options"):
        build_reward("em", colour=1)
    plain = as_outcome_reward(lambda pred, golds: float(pred == golds[0]))
    assert plain.score([Answered("q", "a", ("a",)), Answered("q", "b", ("a",))]) == [1.0, 0.0]


class Half:
    name, kind = "half", "step"

    def score(self, items):
        return [0.5 if it.kind == "memory" else None for it in items]


def test_a_registered_reward_and_an_entry_point(tmp_path, monkeypatch):
    register_reward("half", lambda **o: Half())
    try:
        assert build_reward("half", "step").score([Update("q", ("a",), None, "memory", 0, "x", "y")]) == [0.5]
        assert TrainConfig(step_reward="half").step_reward == "half"
    finally:
        unregister_reward("half")
    (tmp_path / "ep_reward.py").write_text(
        "class Always:\n    name, kind = 'always', 'outcome'\n"
        "    def score(self, items):\n        return [1.0 for _ in items]\n"
        "def build(**options):\n    return Always()\n")
    write_dist_info(tmp_path, "ep-reward", {"memagent.rewards": {"always": "ep_reward:build"}})
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.refresh_entry_points()
    try:
        assert "always" in reward_names()
        assert build_reward("always", "outcome").score([Answered("q", None, ("a",))]) == [1.0]
        assert TrainConfig(reward="always").reward == "always"
    finally:
        monkeypatch.undo()
        registry.refresh_entry_points()
    with pytest.raises(ValueError, match="a word"):
        register_reward("has space", Half)


def test_training_config_keys():
    cfg = load_config(None, ["step_reward=evidence", "step_mix=0.5", "step_scale=true", "reward=f1"])
    assert (cfg.reward, cfg.step_reward, cfg.step_mix, cfg.step_scale) == ("f1", "evidence", 0.5, True)
    assert TrainConfig().reward == "boxed" and TrainConfig().step_reward == "" and TrainConfig().step_mix == 0.8
    assert load_config(None, ["rollout.reward=em"]).reward == "em"  # the old spelling still reads
    with pytest.raises(ConfigError, match="reward: unknown reward 'nope'; valid outcome rewards: boxed, em"):
        load_config(None, ["reward=nope"])
    with pytest.raises(ConfigError, match="step_reward: unknown reward 'evidense'; valid step rewards: "
                                          "answer-likelihood, answer-recall, evidence"):
        load_config(None, ["step_reward=evidense"])
    with pytest.raises(ConfigError, match="step_mix"):
        load_config(None, ["step_mix=1.5"])
    with pytest.raises(ConfigError, match="rollout.reward"):
        load_config(None, ["reward=f1", "rollout.reward=em"])


def test_profile_keys_and_their_precedence(tmp_path):
    from memagent.protocol.profile import Profile, load_profile, training_profile

    path = tmp_path / "p.yaml"
    path.write_text("reward: sub_em\nstep_reward: answer-recall\n")
    prof = load_profile(path)
    assert (prof.reward, prof.step_reward) == ("sub_em", "answer-recall")
    cfg = build_train_config(None, [], profile=prof)
    assert (cfg.reward, cfg.step_reward) == ("sub_em", "answer-recall")
    cfg = build_train_config(None, ["reward=em", "step_reward=evidence"], profile=prof)  # the config's own win
    assert (cfg.reward, cfg.step_reward) == ("em", "evidence")
    written = training_profile(cfg, prof)
    assert (written["reward"], written["step_reward"]) == ("em", "evidence")
    path.write_text("step_reward: boxed\n")  # the profile is a file format: the command that trains looks it up
    with pytest.raises(ConfigError, match="step_reward: 'boxed' is an outcome reward; valid step rewards"):
        build_train_config(None, [], profile=load_profile(path))
    assert (Profile().reward, Profile().step_reward) == ("boxed", "")


def test_cli_unknown_reward_is_one_error_line(run_cli, tmp_path):
    (tmp_path / "c.yaml").write_text(f"out_dir: {tmp_path / 'run'}\n")
    code, out, err = run_cli("train", tmp_path / "c.yaml", "step_reward=evidance")
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: ")
    assert "valid step rewards: answer-likelihood, answer-recall, evidence" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()
    code, _, err = run_cli("demo", "--outcome-only", "--out", tmp_path / "d")
    assert code == 2 and "--outcome-only is a flag of --task two-hop" in err


def test_two_hop_demo_trains_memagent_with_the_evidence_reward_and_lookup_without(monkeypatch, tmp_path):
    import random

    import memagent.rl.trainer as trainer
    from memagent.demo import two_hop
    from memagent.tasks.toy import build_toy_tokenizer

    seen = {}
    monkeypatch.setattr(two_hop, "warm_up", lambda cfg, tok, rows, out: "model")
    monkeypatch.setattr(trainer, "train", lambda cfg, data, **kw: seen.setdefault(cfg.workflow.name, (cfg, data)))
    cfg = two_hop.TwoHopConfig.for_run(True, 0, str(tmp_path))
    tok = build_toy_tokenizer(cfg.spec, two_hop.EXTRA_WORDS)
    for wf in ("lookup", "memagent"):
        two_hop.train_workflow(cfg, wf, tok, random.Random(0), tmp_path)
    assert (seen["memagent"][0].step_reward, seen["memagent"][0].step_mix) == ("evidence", 0.8)
    assert seen["lookup"][0].step_reward == ""  # lookup keeps the outcome reward alone
    assert all(len(q["evidence"]) == 2 for q in seen["memagent"][1])  # every RL question carries its two facts
    assert two_hop.TwoHopConfig.for_run(True, 0, str(tmp_path), outcome_only=True).step_reward == ""
    assert two_hop.TwoHopConfig.for_run(False, 0, "x").step_reward == "evidence"


def test_demo_step_reward_flags_reach_the_training_config(monkeypatch, tmp_path, run_cli):
    """--step-reward / --step-mix set DemoConfig's fields on either task, and the RL phase's TrainConfig gets
    them; an unknown name, or one with --outcome-only, is one error line before any work."""
    from memagent.cli import train as cli_train
    from memagent.demo.pipeline import rl_train_config

    got = {}
    monkeypatch.setattr(cli_train, "run_demo", lambda cfg: got.setdefault("single", cfg))
    monkeypatch.setattr(cli_train, "run_two_hop", lambda cfg: got.setdefault("two", cfg))
    assert run_cli("demo", "--quick", "--step-reward", "evidence", "--step-mix", "0.5", "--out", tmp_path / "a")[0] == 0
    assert run_cli("demo", "--quick", "--task", "two-hop", "--step-reward", "none", "--out", tmp_path / "b")[0] == 0
    single, two = got["single"], got["two"]
    assert (single.step_reward, single.step_mix, two.step_reward, two.step_mix) == ("evidence", 0.5, "", 0.8)
    rl = rl_train_config(single, tmp_path)
    assert (rl.step_reward, rl.step_mix, rl.step_scale) == ("evidence", 0.5, False)
    rl = rl_train_config(dataclasses.replace(single, step_reward="evidence-chain",
                                             step_reward_options={"loss_weight": 0.5}), tmp_path)
    assert (rl.step_reward, rl.step_reward_options) == ("evidence-chain", {"loss_weight": 0.5})  # the bench's
    assert rl_train_config(cli_train.DemoConfig(), tmp_path).step_reward == ""  # single-hop default: the paper's
    code, _, err = run_cli("demo", "--step-reward", "evidance", "--out", tmp_path / "c")
    assert code == 2 and "--step-reward: unknown reward 'evidance'; valid step rewards: " in err
    code, _, err = run_cli("demo", "--task", "two-hop", "--outcome-only", "--step-reward", "evidence",
                           "--out", tmp_path / "d")
    assert code == 2 and "contradict" in err
    assert not any((tmp_path / d).exists() for d in "cd")
