"""The judge reward: strict parsing against hostile replies, bounded retries, the cache, a dead server."""
import time

import pytest

from memagent.backends.base import BackendError, Generation
from memagent.rewards.judge import JudgeError, JudgeReward, answer_text, parse_score
from memagent.rewards.protocol import Answered


@pytest.mark.parametrize("reply, want", [
    ("1", 1.0), ("0", 0.0), ("0.5", 0.5), (" .75\n", 0.75), ("1.0", 1.0), ("0.25", 0.25),
    ("", None), ("no number here", None), ("1e309", None), ("inf", None), ("nan", None), ("-0", None),
    ("0.5 but actually 1", None), ("Grade: 1", None), ("1.5", None), ("2", None), ("0.5.", None), ("½", None),
    ("x" * 10_000, None), ("1" + " " * 10_000, None), ("0" * 40, None), (None, None),
])
def test_parse_score_is_strict(reply, want):
    assert parse_score(reply) == want


class Scripted:
    """A backend that answers each judge prompt from a list of replies (by call), or raises."""

    def __init__(self, replies):
        self.replies, self.prompts = list(replies), []

    def generate(self, prompts, params):
        assert params.temperature == 0.0 and params.max_new_tokens == 8
        self.prompts.append(list(prompts))
        out = []
        for _ in prompts:
            r = self.replies.pop(0)
            if isinstance(r, Exception):
                raise r
            out.append(Generation(text=r, token_ids=[1], logprobs=None, prompt_token_ids=None))
        return out


def item(answer, question="Who wrote Hamlet?", golds=("William Shakespeare",)):
    return Answered(question, answer, golds)


def test_hostile_replies_are_retried_then_scored_zero_and_counted():
    backend = Scripted(["0.5 but actually 1", "1e309", "x" * 10_000,  # three answers, round 1: all unparseable
                        "1", "no number", "0.25",  # round 2: two parse
                        "nonsense again"])  # round 3 (the last retry) for the one left
    judge = JudgeReward(backend, retries=2)
    got = judge.score([item("\\boxed{Shakespeare}"), item("Marlowe"), item("Shakespeare, probably")])
    assert got == [1.0, 0.0, 0.25]
    assert [len(p) for p in backend.prompts] == [3, 3, 1]  # only the unparseable ones are asked again
    assert judge.stats["unparseable"] == 1 and judge.stats["retried"] == 4
    assert "Answer: Shakespeare\n" in backend.prompts[0][0]  # the boxed answer is what is graded
    assert "Reference: William Shakespeare" in backend.prompts[0][0]


def test_cache_by_question_answer_reference():
    backend = Scripted(["1", "0"])
    judge = JudgeReward(backend)
    first = judge.score([item("Shakespeare"), item("\\boxed{Shakespeare}"), item("Bacon")])
    assert first == [1.0, 1.0, 0.0] and len(backend.prompts[0]) == 2  # the same answer is graded once
    assert judge.score([item("Shakespeare")]) == [1.0] and len(backend.prompts) == 1  # cached
    assert judge.score([item(None), item("\\boxed{}")]) == [0.0, 0.0] and len(backend.prompts) == 1  # no answer: 0
    assert judge.metrics()["reward/judge/cached"] == 4.0
    with pytest.raises(IndexError):  # another reference is another key: asked (and this script is empty)
        judge.score([item("Shakespeare", golds=("Marlowe",))])


def test_backend_errors_are_retried_within_the_bound():
    flaky = Scripted([BackendError("503"), "1"])
    assert JudgeReward(flaky, retries=1).score([item("Shakespeare")]) == [1.0]
    dead = Scripted([BackendError("refused")] * 3)
    with pytest.raises(JudgeError, match="failed 3 time"):
        JudgeReward(dead, retries=2).score([item("Shakespeare")])
    with pytest.raises(ValueError, match="name the grading model"):
        JudgeReward()


def test_a_dead_server_is_one_clear_error_quickly(tiny_model_dir, refused_url):
    judge = JudgeReward(backend="openai", model=str(tiny_model_dir), tokenizer=str(tiny_model_dir),
                        base_url=refused_url, request_retries=0, retries=1)
    t = time.perf_counter()
    with pytest.raises(JudgeError, match="judge") as err:
        judge.score([item("Shakespeare")])
    assert time.perf_counter() - t < 30 and "Traceback" not in str(err.value)


def test_the_judge_is_a_registered_outcome_reward():
    from memagent.config import ConfigError
    from memagent.rewards.registry import build_reward
    from memagent.rl.config import load_config

    judge = build_reward("judge", "outcome", backend_object=Scripted(["1"]))
    assert judge.score([item("Shakespeare")]) == [1.0]
    cfg = load_config(None, ["reward=judge", "reward_options.model=grader",
                             "reward_options.base_url=http://localhost:1/v1"])
    assert cfg.reward == "judge"  # checked by name; nothing is contacted before training
    with pytest.raises(ConfigError, match="step_reward: 'judge' is an outcome reward; valid step rewards"):
        load_config(None, ["step_reward=judge"])  # looked up where the config is resolved (issue 46)
    assert answer_text("the answer is \\boxed{ 42 }") == "42" and answer_text(None) == ""


def test_a_live_openai_compatible_server_grades_through_http(openai_server, tiny_model_dir):
    """The tiny model behind the loopback server writes no grade: every reply is unparseable after the retries,
    scored 0 and counted; the requests are greedy and as short as the judge asks."""
    judge = JudgeReward(backend="openai", model="tiny", tokenizer=str(tiny_model_dir), base_url=openai_server.url,
                        retries=1)
    got = judge.score([item("Shakespeare"), item("Marlowe"), item("Shakespeare")])
    assert got == [0.0, 0.0, 0.0]
    # two distinct answers, asked twice each (retries=1), both unparseable; the repeated answer cached
    assert judge.stats == {"calls": 4, "cached": 1, "unparseable": 2, "retried": 2}
    bodies = openai_server.bodies
    assert bodies and all(b["max_tokens"] == 8 and b["temperature"] == 0.0 for b in bodies)
    assert "Grade an answer" in bodies[0]["messages"][0]["content"]
