"""A third-party reward's faults are its own (issue 48, class 2): what its import, factory or `score` raises, and a
score that is no finite number per item (a string, a numeric string, None, an empty list, one value for many
conversations, NaN), is one `RewardError` naming the plug-in (in `train` one error line, exit 2, not a traceback
nor "training diverged ... lower optim.lr"); a score that runs on is said, then stopped; a plug-in that breaks as
it is imported never turns another name's error into its traceback."""
from __future__ import annotations

import json
import logging
import time

import pytest
from plugin_dist import write_dist_info

from memagent.config import ConfigError
from memagent.rewards import registry
from memagent.rewards.protocol import Answered, Update
from memagent.rewards.registry import RewardError, build_reward, register_reward, unregister_reward

MODULE = "module test_reward_plugin_faults"
ANSWERS = [Answered("q", "a", ("a",)), Answered("q", "b", ("a",))]
UPDATES = [Update("q", ("a",), None, "memory", i, "x", "y") for i in range(3)]


class Scripted:
    """A reward of `kind` whose score returns `values(items)`."""

    def __init__(self, kind, values):
        self.name, self.kind, self.values = "scripted", kind, values

    def score(self, items):
        return self.values(items)


def _boom(items):
    raise ZeroDivisionError("bad gold")


BAD_SCORES = [
    ("outcome", lambda items: "1.0", "scored 2 items with str, not a list of numbers"),
    ("outcome", lambda items: ["1.0"] * len(items), "gave '1.0' for item 0, not a finite number"),
    ("outcome", lambda items: None, "scored 2 items with NoneType, not a list of numbers"),
    ("outcome", lambda items: [None] * len(items), "gave None for item 0, not a finite number"),
    ("outcome", lambda items: [], "gave 0 values for 2 answers: one value per item"),
    ("outcome", lambda items: [1.0, float("nan")], "gave nan for item 1, not a finite number"),
    ("outcome", _boom, "failed scoring 2 items: ZeroDivisionError: bad gold"),
    ("step", lambda items: [0.5], "gave 1 values for 3 conversations: one value per item"),
    ("step", lambda items: ["x", None, 1], "gave 'x' for item 0, not a finite number or None"),
    ("step", lambda items: [float("inf"), None, 1], "gave inf for item 0, not a finite number or None"),
]


@pytest.mark.parametrize("kind, values, message", BAD_SCORES, ids=[m.split(",")[0][:30] for *_, m in BAD_SCORES])
def test_a_bad_score_is_one_error_naming_the_plugin(kind, values, message):
    register_reward("bad", lambda **o: Scripted(kind, values))
    try:
        reward = build_reward("bad", kind)
        with pytest.raises(RewardError) as e:
            reward.score(ANSWERS if kind == "outcome" else UPDATES)
    finally:
        unregister_reward("bad")
    assert str(e.value).startswith(f"reward 'scripted' (a plug-in, {MODULE}) {message}"), str(e.value)
    assert "this is a fault of the plug-in, not of memagent" in str(e.value)


def test_a_sound_plugin_scores_as_it_says():
    register_reward("ok", lambda **o: Scripted("step", lambda items: [1, None, 0.25]))
    try:
        reward = build_reward("ok", "step")
    finally:
        unregister_reward("ok")
    assert reward.score(UPDATES) == [1.0, None, 0.25] and reward.inner.values(UPDATES) == [1, None, 0.25]


def test_a_factory_that_raises_is_named():
    def factory(**options):
        raise RuntimeError("no judge model")

    register_reward("bad", factory)
    try:
        with pytest.raises(RewardError, match=rf"reward 'bad' \(a plug-in, {MODULE}\) failed as it was built: "
                                              "RuntimeError: no judge model"):
            build_reward("bad", "outcome")
    finally:
        unregister_reward("bad")


def test_a_score_that_runs_on_is_said_then_stopped(monkeypatch, caplog):
    monkeypatch.setattr(registry, "SCORE_WARN_S", 0.1)
    monkeypatch.setattr(registry, "SCORE_TIMEOUT_S", 0.6)
    register_reward("slow", lambda **o: Scripted("outcome", lambda items: time.sleep(5) or [1.0] * len(items)))
    try:
        reward = build_reward("slow")
        t0 = time.perf_counter()
        with caplog.at_level(logging.WARNING), pytest.raises(RewardError, match=r"did not finish scoring 2 items "
                                                                                 r"in 1 s"):
            reward.score(ANSWERS)
    finally:
        unregister_reward("slow")
    assert time.perf_counter() - t0 < 3
    assert any("has been scoring 2 items" in r.getMessage() for r in caplog.records)


@pytest.fixture
def broken_installed(tmp_path, monkeypatch):
    """An installed reward plug-in whose module raises as it is imported."""
    site = tmp_path / "site"
    write_dist_info(site, "broken-reward", {"memagent.rewards": {"broken": "broken_reward:build"}})
    (site / "broken_reward.py").write_text("raise RuntimeError('broken at import')\n")
    monkeypatch.syspath_prepend(str(site))
    registry.refresh_entry_points()
    yield
    monkeypatch.undo()
    registry.refresh_entry_points()


def test_a_broken_plugin_does_not_take_over_other_names_errors(broken_installed, run_cli, tmp_path):
    from memagent.protocol.profile import load_profile
    from memagent.rl.config import build_train_config, load_config

    for overrides, message in ((["reward=nope"], "reward: unknown reward 'nope'; valid outcome rewards: boxed"),
                               (["reward="], "reward: unknown reward ''; valid outcome rewards: boxed"),
                               (["reward=evidence"], "reward: 'evidence' is a step reward; valid outcome rewards: "),
                               (["step_reward=boxed"], "step_reward: 'boxed' is an outcome reward; valid step "
                                                       "rewards: answer-likelihood")):
        with pytest.raises(ConfigError) as e:
            load_config(None, overrides)
        assert message in str(e.value) and "broken" not in str(e.value), (overrides, str(e.value))
    profile = tmp_path / "p.yaml"
    profile.write_text("step_reward: nope\n")
    loaded = load_profile(profile)  # a file format: the name is checked by the command that uses it (issue 46)
    with pytest.raises(ConfigError, match="step_reward: unknown reward 'nope'; valid step rewards: answer-likelihood"):
        build_train_config(None, [], profile=loaded)
    code, _, err = run_cli("demo", "--task", "two-hop", "--step-reward", "nope", "--out", tmp_path / "d")
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "--step-reward: unknown reward 'nope'; valid step rewards: " in err
    # the broken one itself, asked for by name: one line naming it
    with pytest.raises(ConfigError, match=r"reward 'broken' \(entry point memagent.rewards, broken_reward:build\) "
                                          "failed as it was imported: RuntimeError: broken at import"):
        load_config(None, ["reward=broken"])
    with pytest.raises(RewardError, match="failed as it was imported"):
        build_reward("broken")


def _train_data(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"id": str(i), "question": "Which river?", "answers": ["Nile"],
                                        "context": "the river Nile runs past the city " * 3}) + "\n"
                            for i in range(2)))
    return data


@pytest.mark.slow
@pytest.mark.parametrize("key, kind, values, message", [
    ("reward", "outcome", lambda items: [float("nan")] * len(items), "gave nan for item 0, not a finite number"),
    ("step_reward", "step", lambda items: [0.5], "values for "),
])
def test_train_stops_on_a_bad_score_with_one_line_naming_the_reward(key, kind, values, message, run_cli,
                                                                   tiny_model_dir, tmp_path):
    register_reward("plug", lambda **o: Scripted(kind, values))
    try:
        cfg = tmp_path / "train.yaml"
        cfg.write_text(f"model: {tiny_model_dir}\ndata: {_train_data(tmp_path)}\nout_dir: {tmp_path / 'run'}\n")
        code, _, err = run_cli("train", cfg, f"{key}=plug", "total_steps=1", "save_every=0", "progress=false",
                               "rollout.batch_size=2", "rollout.group_size=2", "update.mini_batch_size=2",
                               "agent.chunk_tokens=12", "agent.answer_tokens=4")
    finally:
        unregister_reward("plug")
    lines = err.strip().splitlines()
    assert code == 2 and "Traceback" not in err and "diverged" not in err, err
    assert lines[-1].startswith(f"error: reward 'scripted' (a plug-in, {MODULE}) ") and message in lines[-1], err


def test_eval_with_a_profiles_broken_reward_is_one_line(run_cli, tiny_model_dir, tmp_path):
    """An eval profile's `reward:` naming a plug-in whose score is a string: the sample fails, its record naming the
    plug-in, and the run ends with eval's one line (exit 2)."""
    register_reward("plug", lambda **o: Scripted("outcome", lambda items: "high"))
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps(dict(id="s0", task="qa", question="Where?", answers=["x"], metric="sub_em",
                                    context="words " * 20, length=10)) + "\n")
    profile = tmp_path / "p.yaml"
    profile.write_text("reward: plug\n")
    try:
        code, _, err = run_cli("eval", "--model", tiny_model_dir, "--data", data, "--out", tmp_path / "run",
                               "--methods", "memagent", "--profile", profile, "--chunk-tokens", 64,
                               "--memory-tokens", 8, "--answer-tokens", 8, "--device", "cpu", "--no-progress")
    finally:
        unregister_reward("plug")
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and "Traceback" not in err and errors == [errors[-1]], err
    assert errors[-1].startswith("error: 1 of 1 samples failed; see the records"), err  # the sample fails alone
    [record] = [json.loads(line) for line in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
    assert record["status"] == "error" and f"reward 'scripted' (a plug-in, {MODULE}) scored 1 items with str, not " \
        "a list of numbers" in json.dumps(record), record
