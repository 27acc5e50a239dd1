"""`memagent data judge` (memagent.eval.judged): an eval run over `data streams` look-alikes graded by the judge
reward, by method and ability: hand-worked grades from a fake judge, and the CLI end to end with the tiny model as
the judge (it writes no grade: each answer is unparseable, scored 0 and counted)."""
import json
import re

import pytest

from memagent.backends.base import Generation
from memagent.eval.judged import judge_results
from memagent.rewards.judge import JudgeReward


class Grader:
    """A judge backend: "1" when the graded answer is the reference (case aside), else "0"; keeps the prompts."""

    def __init__(self):
        self.prompts = []

    def generate(self, prompts, params):
        self.prompts += prompts
        out = []
        for p in prompts:
            ref = re.search(r"^Reference: (.*)$", p, re.M).group(1).strip().lower()
            ans = re.search(r"^Answer: (.*)$", p, re.M).group(1).strip().lower()
            out.append(Generation(text="1" if ans == ref else "0", token_ids=[1], logprobs=None, prompt_token_ids=None))
        return out


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_model_dir):
    """An eval run of the tiny model over one look-alike chat (five questions, one per ability)."""
    from memagent.cli import run

    root = tmp_path_factory.mktemp("judge")
    data = root / "look.jsonl"
    assert run(["data", "streams", "--out", str(data), "--conversations", "1", "--sessions", "2", "--seed", "3"]) == 0
    out = root / "run"
    assert run(["eval", "--model", str(tiny_model_dir), "--data", str(data), "--out", str(out), "--methods", "memagent",
                "--chunk-tokens", "64", "--memory-tokens", "16", "--answer-tokens", "8", "--query-tokens", "64",
                "--no-progress"]) == 0
    return out


def test_grades_by_method_and_ability_hand_worked(run_dir, tmp_path):
    records = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert len(records) == 5 and {r["status"] for r in records} == {"ok"}
    for i in (0, 2):  # two answers made right by hand; the tiny model's own are not its gold
        records[i]["raw"] = "\\boxed{" + records[i]["gold"][0].upper() + "}"
    edited = tmp_path / "results.jsonl"
    edited.write_text("".join(json.dumps(r) + "\n" for r in records))
    grader = Grader()
    table = judge_results(edited, JudgeReward(grader), tmp_path / "judged.jsonl")
    samples = {json.loads(line)["id"]: json.loads(line) for line in (run_dir.parent / "look.jsonl").read_text().splitlines()}
    abilities = [samples[r["sample_id"]]["ability"] for r in records]
    assert len(set(abilities)) == 5  # one question per ability
    rows = {r["ability"]: r for r in table}
    assert [r["ability"] for r in table] == [*abilities, "all"]
    for i, r in enumerate(records):
        own = rows[abilities[i]]
        assert own["n"] == 1 and own["judge"] == (1.0 if i in (0, 2) else 0.0) and own["score"] == r["score"]
    assert rows["all"]["n"] == 5 and rows["all"]["judge"] == pytest.approx(2 / 5)
    assert rows["all"]["score"] == pytest.approx(sum(r["score"] for r in records) / 5)
    # each prompt names the question the data file holds, the gold and the boxed answer graded
    assert len(grader.prompts) == 5 and all(f"Question: {samples[r['sample_id']]['question']}\n" in p
                                            for r, p in zip(records, grader.prompts))
    judged = [json.loads(line) for line in (tmp_path / "judged.jsonl").read_text().splitlines()]
    assert [j["judge"] for j in judged] == [1.0, 0.0, 1.0, 0.0, 0.0] and judged[0]["ability"] == abilities[0]


def test_cli_with_the_tiny_model_as_judge(run_dir, run_cli, tiny_model_dir):
    code, out, err = run_cli("data", "judge", run_dir, "--judge-model", tiny_model_dir, "--judge-backend",
                             "transformers", "--retries", "0")
    assert code == 0, err
    lines = [line for line in out.splitlines() if line.startswith("| memagent |")]
    assert len(lines) == 6 and lines[-1].startswith("| memagent | all | 5 |")
    calls = int(re.search(r"judge calls (\d+)", err).group(1))
    unparseable = int(re.search(r"unparseable (\d+)", err).group(1))
    judged = [json.loads(line) for line in (run_dir / "judged.jsonl").read_text().splitlines()]
    assert 1 <= calls <= 5 and len(judged) == 5 and all(0 <= j["judge"] <= 1 for j in judged)
    assert sum(j["judge"] == 0 for j in judged) >= unparseable  # an unparseable grade scores 0
    code, _, err = run_cli("data", "judge", run_dir / "nothing", "--judge-model", "m")
    assert code == 2 and err.startswith("error: ") and "results.jsonl" in err
