"""What moves the demo's warm-up (docs/demo.md, "The same table on every machine"): seed 0's data and warm-up
as `memagent demo` runs them, then the no-RL model at 1x and 4x, under one float-kernel setting per process.

    python bench/demo_numerics.py                      # every setting below, one after the other (~1 min each alone)
    python bench/demo_numerics.py --only MKL_CBWR=AVX2  # one setting

Writes bench/results/demo_numerics.json: per setting the SHA-256 prefix of the warm-up weights and the accuracies."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

SETTINGS = ["", "OMP_NUM_THREADS=1", "ATEN_CPU_CAPABILITY=avx2", "ATEN_CPU_CAPABILITY=default",
            "ONEDNN_MAX_CPU_ISA=AVX2", "ONEDNN_MAX_CPU_ISA=AVX512_CORE", "MKL_CBWR=AVX512", "MKL_CBWR=AVX512_E1",
            "MKL_CBWR=AVX512_E2", "MKL_CBWR=AVX512_E3", "MKL_CBWR=AVX2", "MKL_CBWR=COMPATIBLE"]

PROBE = """
import hashlib, json, random, tempfile
from pathlib import Path
import torch
from memagent.demo.config import DemoConfig
from memagent.demo.evaluate import run_memagent
from memagent.demo.failures import accuracy
from memagent.demo.pipeline import make_data, warm_up
from memagent.tasks.toy import build_toy_tokenizer

cfg = DemoConfig(seed=0, out=tempfile.mkdtemp())
rng = random.Random(cfg.seed)
tok = build_toy_tokenizer(cfg.spec)
torch.manual_seed(cfg.seed)
data = make_data(cfg, tok, rng)
model = warm_up(cfg, tok, data.warm, Path(cfg.out))
res = {"weights": hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()[:12],
       "threads": torch.get_num_threads(), "aten": torch.backends.cpu.get_cpu_capability()}
for m in (1, 4):
    res[f"no_rl_{m}x"] = round(100 * accuracy(run_memagent(model, tok, data.evals[m], cfg.spec), data.evals[m]), 1)
print("RESULT " + json.dumps(res), flush=True)
"""


def run(setting: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}  # MKL's own choice unless the setting names one
    if setting:
        key, value = setting.split("=", 1)
        env[key] = value
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", help="one setting VAR=VALUE ('' for MKL's own choice)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "demo_numerics.json"))
    args = ap.parse_args()
    settings = SETTINGS if args.only is None else [args.only]
    results = {s or "MKL's own choice": run(s) for s in settings}
    for s, r in results.items():
        print(s, r, flush=True)
    Path(args.out).write_text(json.dumps({"seed": 0, "settings": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
