"""bench/real_model_recipe.py's counting, on hand-made results files: a cell counts the records under its latest
fingerprint, one a sample (`current_records`), and RL is set against the warm-up document by document (`paired`).
Run in a subprocess: bench/real_model.py and tests/real_model.py share a module name."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
