"""Are the trainers' numbers unchanged by a refactor? Record them, then compare.

    python bench/rl_equivalence.py record bench/results/rl_equivalence_before.json   # on the old code
    python bench/rl_equivalence.py record /tmp/after.json                            # on the new code
    python bench/rl_equivalence.py compare bench/results/rl_equivalence_before.json /tmp/after.json

Scenarios (all on CPU, the tiny model of `memagent tiny-model`, data written here):
    tiny       configs/rl/tiny.yaml as the CLI runs it (data from a JSONL file, the boxed reward)
    tiny_signal  the same config with a reward the random model can earn (non-zero advantages)
    mixed      dynamic sampling, sample-mean aggregation, rollout log-probs and the auxiliary
               supervised objective (loss.sft_coef) on rows of our own
    sft        `train_sft`: 3 optimiser steps of supervised warm-up
Each scenario keeps its metrics.jsonl records without the timing fields and a SHA-256 of the final
weights; `compare` requires every float and every hash to be identical.

A record is of one machine: float sums round by the processor's BLAS path, so compare records made on the same
kind of processor. bench/results/rl_equivalence_before.json was recorded on an Intel Xeon (AVX-512),
bench/results/rl_equivalence_before_amd.json on an AMD EPYC (AVX-512), both at commit fe7c060 (before round 3's
middle-layer refactor); the two differ in the last digits (e.g. grad_norm 8.699734687805176 vs 8.69973373413086).
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
os.environ.setdefault("OMP_NUM_THREADS", "1")

TIMING = {"rollout_s", "update_s", "step_s", "tokens_per_s"}


def weights_hash(model: Any) -> str:
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def symbol_reward(prediction: str | None, golds: Any) -> float:
    """1 when the reply does not start with a letter: a random tiny model earns it about a third of the time."""
    return 0.0 if (prediction or "").strip()[:1].isalpha() else 1.0


def write_data(path: Path, n: int = 12) -> list[dict[str, Any]]:
    rows = [{"id": f"q{i}", "task": "bench", "question": f"which number goes with key {i}?",
             "context": f"key {i} goes with {i * 3}. the lake is green and the road is long. key {i + 1} is other.",
             "answers": [str(i * 3)]} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return rows


def records(out_dir: Path) -> list[dict[str, Any]]:
    lines = (out_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [{k: v for k, v in json.loads(x).items() if k not in TIMING} for x in lines]


def run_rl(work: Path, name: str, overrides: list[str], reward: Any = None, sft_rows: Any = None) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memagent.rl.config import load_config
    from memagent.rl.trainer import train

    cfg = load_config(ROOT / "configs/rl/tiny.yaml", [f"model={work / 'tiny_model'}", f"data={work / 'train.jsonl'}",
                                                      f"out_dir={work / name}", "progress=false", *overrides])
    model = AutoModelForCausalLM.from_pretrained(work / "tiny_model")
    tok = AutoTokenizer.from_pretrained(work / "tiny_model")
    res = train(cfg, None, reward, model=model, tokenizer=tok, sft_data=sft_rows)
    return {"metrics": records(work / name), "weights": weights_hash(res.model)}


def aux_rows(tok: Any) -> list[tuple[list[int], list[int]]]:
    return [(tok(f"note {i}:")["input_ids"], tok(f" value {i * 5}", add_special_tokens=False)["input_ids"]
             + [tok.eos_token_id]) for i in range(6)]


def run_sft(work: Path) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memagent.rl.config import OptimConfig
    from memagent.rl.sft import SFTConfig, train_sft

    model = AutoModelForCausalLM.from_pretrained(work / "tiny_model")
    tok = AutoTokenizer.from_pretrained(work / "tiny_model")
    cfg = SFTConfig(out_dir=str(work / "sft"), seed=3, epochs=2.0, batch_size=4, micro_batch_size=3, progress=False,
                    device="cpu", optim=OptimConfig(lr=1e-3, warmup_steps=1, weight_decay=0.01, schedule="cosine"))
    res = train_sft(cfg, aux_rows(tok), model, tok)
    return {"metrics": records(work / "sft"), "weights": weights_hash(res.model)}


def record(path: Path) -> None:
    import torch
    from transformers import AutoTokenizer

    from memagent.backends.tiny import build_tiny_model

    torch.set_num_threads(1)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        build_tiny_model(work / "tiny_model", seed=0)
        write_data(work / "train.jsonl")
        tok = AutoTokenizer.from_pretrained(work / "tiny_model")
        out["tiny"] = run_rl(work, "tiny", [])
        out["tiny_signal"] = run_rl(work, "tiny_signal", ["total_steps=3"], reward=symbol_reward)
        out["mixed"] = run_rl(work, "mixed", [
            "total_steps=3", "rollout.dynamic_sampling=true", "rollout.max_sampling_rounds=2", "loss.agg=sample-mean",
            "update.old_logprobs=rollout", "update.micro_batch_size=5", "loss.sft_coef=0.5", "loss.sft_batch_size=3",
            "loss.kl_coef=0.01"], reward=symbol_reward, sft_rows=aux_rows(tok))
        out["sft"] = run_sft(work)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    for name, r in out.items():
        print(f"{name}: {len(r['metrics'])} records, weights {r['weights'][:16]}")


def compare(a_path: Path, b_path: Path) -> int:
    a, b = json.loads(a_path.read_text()), json.loads(b_path.read_text())
    bad = 0
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            print(f"{name}: only in {'the first' if name in a else 'the second'} file")
            bad += 1
            continue
        ra, rb = a[name]["metrics"], b[name]["metrics"]
        diffs = [f"step {x.get('step')}: {k} {x.get(k)!r} != {y.get(k)!r}"
                 for x, y in zip(ra, rb) for k in sorted(set(x) | set(y)) if x.get(k) != y.get(k)]
        if len(ra) != len(rb):
            diffs.append(f"{len(ra)} records != {len(rb)}")
        if a[name]["weights"] != b[name]["weights"]:
            diffs.append("final weights differ")
        keys = sum(len(x) for x in ra)
        print(f"{name}: {'IDENTICAL' if not diffs else 'DIFFERENT'} ({len(ra)} steps, {keys} values, weights hash "
              f"{'equal' if a[name]['weights'] == b[name]['weights'] else 'differs'})")
        for d in diffs[:20]:
            print("   ", d)
        bad += bool(diffs)
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "record":
        record(Path(sys.argv[2]))
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
    else:
        sys.exit(__doc__)
