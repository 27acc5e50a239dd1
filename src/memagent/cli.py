"""The `memagent` command line: each command parses, builds a config and calls one library function."""
from __future__ import annotations

import errno
import logging
import os
import sys
import traceback
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="MemAgent: read documents of any length with a fixed-size, RL-trained memory.")


def _quiet_libraries() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.getLogger("bm25s").setLevel(logging.WARNING)  # it logs every index build at DEBUG
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:
        pass


@app.command()
def ask(
    model: str = typer.Option(..., "--model", help="Hugging Face id, local directory, or served model name."),
    question: Optional[str] = typer.Option(None, "--question", help="The question to answer."),
    document: Optional[str] = typer.Option(None, "--document", help="Text file to read, or - for stdin."),
    input: Optional[Path] = typer.Option(None, "--input", help="JSONL of many: {id, question, context | document}; runs as one batch."),
    output: Optional[Path] = typer.Option(None, "--output", help="With --input: where to write one JSON result a line (default stdout)."),
    backend: str = typer.Option("transformers", "--backend", help="transformers | openai | vllm"),
    profile: Optional[Path] = typer.Option(None, "--profile", help="Protocol profile (YAML, e.g. configs/profiles/memagent.yaml); flags override it."),
    chunk_tokens: Optional[int] = typer.Option(None, "--chunk-tokens", help="C: document tokens per memory call (default: the profile's, 5000, or the model's memagent.json)."),
    memory_tokens: Optional[int] = typer.Option(None, "--memory-tokens", help="M: hard cap on the memory (default: the profile's, 1024, or memagent.json)."),
    answer_tokens: Optional[int] = typer.Option(None, "--answer-tokens", help="Max new tokens of the final answer (default: the profile's, 1024, or memagent.json)."),
    query_tokens: Optional[int] = typer.Option(None, "--query-tokens", help="Budget of the question (default: the profile's, 1024, or memagent.json)."),
    trace: Optional[Path] = typer.Option(None, "--trace", help="Write one JSONL record per model call."),
    trace_chunks: bool = typer.Option(False, "--trace-chunks", help="With --trace: also write each chunk's text (chunk_text), for `memagent report`."),
    errors: str = typer.Option("strict", "--errors", help="strict: invalid UTF-8 is an error; replace: substitute U+FFFD."),
    temperature: Optional[float] = typer.Option(None, "--temperature", help="0 = greedy (default: the profile's, 0)."),
    top_p: Optional[float] = typer.Option(None, "--top-p", help="Nucleus sampling (default: the profile's, 1.0)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Sampling seed (default: the profile's, none)."),
    batch_docs: int = typer.Option(16, "--batch-docs", help="Documents in flight at once."),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="openai backend: server URL, e.g. http://localhost:8000/v1"),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="openai (and vllm) backend: the served model's tokenizer for chunking (HF id or path); default the model name."),
    max_concurrency: int = typer.Option(8, "--max-concurrency", help="openai backend: requests in flight at once."),
    request_timeout: float = typer.Option(600.0, "--request-timeout", help="openai backend: seconds one try may take in all (connect, send, every byte of the reply)."),
    max_retries: int = typer.Option(4, "--max-retries", help="openai backend: retries on 5xx, 429, timeouts and refused connections."),
    device: str = typer.Option("auto", "--device", help="transformers backend: auto | cpu | cuda | mps"),
    dtype: str = typer.Option("auto", "--dtype", help="transformers / vllm backend: auto | float32 | bfloat16 | float16"),
    tensor_parallel: int = typer.Option(1, "--tensor-parallel", help="vllm backend: tensor-parallel size (GPUs)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bar on stderr."),
) -> None:
    """Answer a question over a document of any length (or many, with --input)."""
    options = dict(locals())
    from memagent.run import AskOptions, run_ask

    run_ask(AskOptions(**_split_backend_options(options)))


_BACKEND_FLAGS = ("backend", "base_url", "tokenizer", "device", "dtype", "tensor_parallel", "max_concurrency",
                  "request_timeout", "max_retries")


def _split_backend_options(options: dict) -> dict:
    """The command's options with its backend flags gathered into one BackendOptions (as `backend`)."""
    from memagent.backends.options import BackendOptions

    backend = {k: options.pop(k) for k in _BACKEND_FLAGS}
    backend["name"] = backend.pop("backend")
    return dict(options, backend=BackendOptions(**backend))


@app.command("report")
def report_cmd(
    trace: Path = typer.Argument(..., help="A JSONL trace (`ask --trace FILE`)."),
    out: Path = typer.Option(..., "--out", help="HTML file to write (one self-contained file)."),
    doc: Optional[str] = typer.Option(None, "--doc", help="Only this document (its doc_id); default: every document."),
) -> None:
    """The memory timeline of a trace as one static HTML file: each chunk, the memory after it, what changed."""
    from memagent.report import write_report

    n = write_report(trace, out, doc)
    typer.echo(f"wrote the timeline of {n} document(s) to {out}", err=True)


@app.command()
def serve(
    model: str = typer.Option(..., "--model", help="Hugging Face id, local directory, or served model name."),
    backend: str = typer.Option("transformers", "--backend", help="transformers | openai | vllm"),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind; another than loopback needs --api-key-env."),
    port: int = typer.Option(8000, "--port", help="TCP port."),
    state_dir: Path = typer.Option(Path("memagent-state"), "--state-dir", help="Folder of the SQLite job store and the uploaded documents (a restart resumes its jobs)."),
    api_key_env: Optional[str] = typer.Option(None, "--api-key-env", help="Environment variable holding the key clients send as 'Authorization: Bearer KEY'."),
    profile: Optional[Path] = typer.Option(None, "--profile", help="Protocol profile (YAML); flags override it."),
    chunk_tokens: Optional[int] = typer.Option(None, "--chunk-tokens", help="C: document tokens per memory call."),
    memory_tokens: Optional[int] = typer.Option(None, "--memory-tokens", help="M: hard cap on the memory."),
    answer_tokens: Optional[int] = typer.Option(None, "--answer-tokens", help="Max new tokens of the final answer."),
    query_tokens: Optional[int] = typer.Option(None, "--query-tokens", help="Budget of a question."),
    max_jobs: int = typer.Option(4, "--max-jobs", help="Jobs run at once."),
    max_queue: int = typer.Option(64, "--max-queue", help="Jobs waiting beyond --max-jobs; more get 429 with Retry-After."),
    max_body_bytes: int = typer.Option(16 << 20, "--max-body-bytes", help="Largest JSON request (a document sent inline included)."),
    max_document_bytes: int = typer.Option(8 << 30, "--max-document-bytes", help="Largest uploaded document."),
    max_question_chars: int = typer.Option(8192, "--max-question-chars", help="Longest question."),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="openai backend: server URL, e.g. http://localhost:8001/v1"),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="openai (and vllm) backend: the served model's tokenizer."),
    max_concurrency: int = typer.Option(8, "--max-concurrency", help="openai backend: requests in flight at once."),
    request_timeout: float = typer.Option(600.0, "--request-timeout", help="openai backend: seconds one try may take in all."),
    max_retries: int = typer.Option(4, "--max-retries", help="openai backend: retries on 5xx, 429, timeouts and refused connections."),
    device: str = typer.Option("auto", "--device", help="transformers backend: auto | cpu | cuda | mps"),
    dtype: str = typer.Option("auto", "--dtype", help="transformers / vllm backend: auto | float32 | bfloat16 | float16"),
    tensor_parallel: int = typer.Option(1, "--tensor-parallel", help="vllm backend: tensor-parallel size (GPUs)."),
) -> None:
    """Serve long-document QA over HTTP: OpenAI chat completions, jobs with live events, and the page at /."""
    options = dict(locals())
    from memagent.serve.main import ServeOptions, run_serve

    run_serve(ServeOptions(**_split_backend_options(options)))


@app.command("tiny-model")
def tiny_model(
    out_dir: Path = typer.Argument(..., help="Directory to write the model and tokenizer to."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random weights."),
    force: bool = typer.Option(False, "--force", help="Overwrite a model or run already in DIR."),
) -> None:
    """Write a tiny randomly initialised Qwen2 model + byte-level tokenizer (safetensors)."""
    from memagent.backends.tiny import build_tiny_model
    from memagent.flags import check_flags
    from memagent.io import check_output_dir, refuse_occupied

    check_flags(dict(seed=seed))
    check_output_dir(out_dir, "DIR")
    refuse_occupied(out_dir, "DIR", force)
    path = build_tiny_model(out_dir, seed=seed)
    typer.echo(f"wrote a tiny model to {path}")


# -- data and cost model ------------------------------------------------------------------------
data_app = typer.Typer(no_args_is_help=True, help="Synthesize evaluation and training data (JSONL), or import released files.")
app.add_typer(data_app, name="data")


def _int_list(text: Optional[str], option: str, minimum: int = 1) -> list[int]:
    """Parse "50,100,200" (underscores allowed: 1_000); every value at least `minimum`."""
    if not text:
        return []
    try:
        values = [int(part.strip().replace("_", "")) for part in text.split(",") if part.strip()]
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated integers, got {text!r}", param_hint=option) from None
    if not values or any(v < minimum for v in values):
        kind = "positive integers" if minimum == 1 else f"integers >= {minimum}"
        raise typer.BadParameter(f"expected {kind}, got {text!r}", param_hint=option)
    return values


def _check_data_flags(values: dict, inputs: dict) -> None:
    """A data command's counts, and its --out: writable and none of its input files."""
    from memagent.flags import check_flags
    from memagent.io import check_output_file

    check_flags({k: v for k, v in values.items() if k not in inputs and k != "out"})
    if values["out"] != "-":
        check_output_file(values["out"], "--out", inputs)


@data_app.command("ruler-hqa")
def data_ruler_hqa(
    source: str = typer.Option(..., "--source", help="HotpotQA-format JSON (e.g. hotpot_dev_distractor_v1.json)."),
    out: str = typer.Option(..., "--out", help="JSONL file to write (- for stdout)."),
    num_docs: Optional[str] = typer.Option(None, "--num-docs", help="Documents per sample, e.g. 50,100,200 (paper: 50 ... 25600)."),
    tokens: Optional[str] = typer.Option(None, "--tokens", help="Or context tokens per sample, e.g. 7000,14000 (needs --tokenizer)."),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="HF id, local path or 'tiny'; lengths are counted in its tokens."),
    samples: int = typer.Option(128, "--samples", help="Questions per length (paper test sets: 128)."),
    seed: int = typer.Option(0, "--seed", help="Same seed, same file, byte for byte."),
    placement: str = typer.Option("random", "--placement", help="random: own permutation per sample (ours); fixed: one seeded permutation per length, the question's paragraphs in the same slots (official; --seed 4 is its permutation)."),
    select: str = typer.Option("shuffle", "--select", help="shuffle: questions in a seeded order (ours); first: in file order, filtered in that order (official)."),
    filter_model: Optional[list[str]] = typer.Option(None, "--filter-model", help="Drop questions this model answers without context; repeatable (official: a base and an instruct model)."),
    filter_backend: str = typer.Option("transformers", "--filter-backend", help="Backend of the --filter-model models."),
    filter_base_url: Optional[list[str]] = typer.Option(None, "--filter-base-url", help="openai backend: server URL of the filter models (one for all, or repeat: one per --filter-model)."),
    filter_replies: int = typer.Option(1, "--filter-replies", help="Sampled replies per model and question (official: 2)."),
    filter_temperature: float = typer.Option(0.0, "--filter-temperature", help="Filter sampling temperature (official: 1.0)."),
    filter_top_p: float = typer.Option(1.0, "--filter-top-p", help="Filter top_p (official: 0.7)."),
    filter_max_tokens: int = typer.Option(64, "--filter-max-tokens", help="Filter reply budget (official: 512)."),
    filter_rule: Optional[list[str]] = typer.Option(None, "--filter-rule", help="sub_em (default) | substring | boxed; repeatable, any match drops (official: substring and boxed)."),
) -> None:
    """RULER-HotpotQA: each question's gold and distractor paragraphs among paragraphs of other questions."""
    from memagent.tasks.ruler_hqa import FilterOptions, write_ruler_hqa

    _check_data_flags(locals(), {"--source": source})
    filt = FilterOptions(models=tuple(filter_model or ()), backend=filter_backend,
                         base_urls=tuple(filter_base_url or ()),
                         replies=filter_replies, temperature=filter_temperature, top_p=filter_top_p,
                         max_tokens=filter_max_tokens, rules=tuple(filter_rule or ("sub_em",)))
    n = write_ruler_hqa(source, out, samples=samples, seed=seed, num_docs=_int_list(num_docs, "--num-docs"),
                        tokens=_int_list(tokens, "--tokens"), tokenizer=tokenizer, filter=filt, placement=placement,
                        select=select)
    typer.echo(f"wrote {n} samples to {out}", err=True)


@data_app.command("ruler")
def data_ruler(
    task: str = typer.Option(..., "--task", help="niah_single_1..3, niah_multikey_1..3, niah_multivalue, niah_multiquery, vt, cwe, fwe, qa_squad."),
    tokens: str = typer.Option(..., "--tokens", help="Context tokens per sample, e.g. 8192,16384."),
    tokenizer: str = typer.Option(..., "--tokenizer", help="HF id, local path or 'tiny'."),
    out: str = typer.Option(..., "--out", help="JSONL file to write (- for stdout)."),
    samples: int = typer.Option(100, "--samples", help="Samples per length."),
    seed: int = typer.Option(0, "--seed"),
    haystack_file: Optional[str] = typer.Option(None, "--haystack-file", help="Text file for the essay haystack."),
    haystack: Optional[str] = typer.Option(None, "--haystack", help="Override a niah task's haystack: noise | essay | needle."),
    source: Optional[str] = typer.Option(None, "--source", help="qa_squad: SQuAD-format JSON."),
) -> None:
    """RULER's out-of-domain tasks, sized in tokens of the given tokenizer."""
    from memagent.tasks.ruler import write_ruler

    _check_data_flags(locals(), {"--source": source, "--haystack-file": haystack_file})

    n = write_ruler(task, out, tokens=_int_list(tokens, "--tokens"), samples=samples, seed=seed, tokenizer=tokenizer,
                    haystack_file=haystack_file, haystack=haystack, source=source)
    typer.echo(f"wrote {n} samples to {out}", err=True)


@data_app.command("import")
def data_import(
    src: Path = typer.Argument(..., help="A released file: eval_{N}.json, training parquet, RULER or LongBench JSON(L)."),
    out: str = typer.Option(..., "--out", help="JSONL file to write (- for stdout)."),
    source: Optional[str] = typer.Option(None, "--source", help="The HotpotQA dev JSON that index contexts point into (eval_{N}.json, N >= 12800)."),
) -> None:
    """Convert a released data file to our sample JSONL (format detected; docs/data.md)."""
    from memagent.tasks.schema import import_released

    n, kind = import_released(src, out, source)
    typer.echo(f"read {src} as {kind}; wrote {n} samples to {out}", err=True)


@data_app.command("toy")
def data_toy(
    chunks: str = typer.Option(..., "--chunks", help="Document lengths in chunks, e.g. 4,16,64."),
    out: str = typer.Option(..., "--out", help="JSONL file to write (- for stdout)."),
    samples: int = typer.Option(100, "--samples", help="Samples per length."),
    seed: int = typer.Option(0, "--seed"),
    facts: int = typer.Option(1, "--facts", help="Facts ('fact KEY VALUE') per chunk."),
    slots: int = typer.Option(3, "--slots", help="Three-word slots per chunk (facts + filler)."),
    keys: int = typer.Option(10, "--keys", help="Number of keys (the demo's task has 10)."),
    values: int = typer.Option(50, "--values", help="Number of values: chance is 1/values."),
) -> None:
    """The toy long-context QA family of the CPU-scale demo (each word one token of the toy tokenizer)."""
    from memagent.tasks.schema import write_samples
    from memagent.tasks.toy import ToySpec, iter_samples

    _check_data_flags(locals(), {})
    try:
        spec = ToySpec(n_keys=keys, n_values=values, facts=facts, slots=slots)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    n = write_samples(iter_samples(spec, _int_list(chunks, "--chunks"), samples, seed), out)
    typer.echo(f"wrote {n} samples to {out} (chunk_tokens for the toy tokenizer: {spec.chunk_tokens})", err=True)


profile_app = typer.Typer(no_args_is_help=True, help="Protocol profiles: every setting that changes a score, in one YAML file.")
app.add_typer(profile_app, name="profile")


@profile_app.command("from-reference")
def profile_from_reference_cmd(
    path: Path = typer.Argument(..., help="Root of your checkout of github.com/BytedTsinghua-SIA/MemAgent."),
    out: Path = typer.Option(..., "--out", help="YAML profile to write."),
    protocol: str = typer.Option("phrase", "--protocol", help="Final-answer protocol of the run: phrase (Table 1) | boxed."),
    baseline_input_tokens: Optional[int] = typer.Option(None, "--baseline-input-tokens", help="Baselines' prompt limit (default: the checkout's MAX_INPUT_LEN, 120000; 990000 for the 1M models)."),
    yarn_factor: Optional[float] = typer.Option(None, "--yarn-factor", help="YaRN rope scaling of the model (e.g. 4.0 for a 128K Qwen2.5)."),
) -> None:
    """Build the official evaluation profile from a checkout of the official repository (read with ast, never run)."""
    from memagent.profile import write_profile
    from memagent.reference import profile_from_reference

    written = write_profile(profile_from_reference(path, protocol, baseline_input_tokens, yarn_factor), out)
    typer.echo(f"wrote the official {protocol} profile to {written}")


@app.command()
def flops(
    model: list[str] = typer.Option(["qwen2.5-7b"], "--model", help="Preset (qwen2.5-7b, qwen2.5-14b) or a config.json / model dir; repeatable."),
    lengths: Optional[str] = typer.Option(None, "--lengths", help="Context lengths (default 8K ... 4M, doubling)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write a PNG of FLOPs against length."),
) -> None:
    """The paper's FLOP comparison of full attention and MemAgent."""
    from rich.console import Console

    from memagent.eval.flops import DEFAULT_LENGTHS, flops_report
    from memagent.io import check_output_file

    if plot is not None:
        check_output_file(plot, "--plot", {f"--model {m}": _model_config(m) for m in model})
        if plot.suffix.lower() not in ("", ".png", ".pdf", ".svg"):
            raise typer.BadParameter(f"{plot.name}: write a .png, .pdf or .svg", param_hint="--plot")
    report = flops_report(model, _int_list(lengths, "--lengths") or DEFAULT_LENGTHS, as_json, plot)
    if as_json:
        typer.echo(report)
    else:
        Console().print(report)


def _check_eval_out(out: Path, data: list[str]) -> None:
    """--out is a writable folder, and no --data file is one of the files eval writes there."""
    from memagent.io import check_not_input, check_output_dir

    for d in data:
        if not Path(d).is_file():
            raise typer.BadParameter(f"{d} {'is a folder' if Path(d).is_dir() else 'does not exist'}; give sample "
                                     "files made by `memagent data ...`", param_hint="--data")
    inputs = {f"--data file {d!r}": d for d in data}
    check_output_dir(out, "--out", inputs)
    for name in ("results.jsonl", "table.md"):
        check_not_input(out / name, inputs, f"--out (its {name})")


def _model_config(model: str) -> Optional[Path]:
    """The config.json a --model names (the file itself, or the one in a model folder); None for a preset."""
    p = Path(model)
    return p / "config.json" if p.is_dir() else p if p.is_file() else None


@app.command("eval")
def eval_(
    model: str = typer.Option(..., "--model", help="Hugging Face id, local directory, or served model name."),
    data: str = typer.Option(..., "--data", help="Sample files from `memagent data`, comma-separated."),
    out: Path = typer.Option(..., "--out", help="Directory for results.jsonl, table.md and plots (a rerun resumes)."),
    methods: str = typer.Option("memagent,full-context,rag-bm25", "--methods", help="Any of memagent, full-context, rag-bm25."),
    backend: str = typer.Option("transformers", "--backend", help="transformers | openai | vllm"),
    profile: Optional[Path] = typer.Option(None, "--profile", help="Protocol profile (YAML, e.g. from `memagent profile from-reference`); flags override it. Written to OUT/profile.yaml."),
    chunk_tokens: Optional[int] = typer.Option(None, "--chunk-tokens", help="MemAgent: document tokens per memory call (default: the profile's, 5000)."),
    memory_tokens: Optional[int] = typer.Option(None, "--memory-tokens", help="MemAgent: memory cap (default: the profile's, 1024)."),
    answer_tokens: Optional[int] = typer.Option(None, "--answer-tokens", help="MemAgent: max new tokens of the answer (baselines too unless the profile sets budgets.baseline_answer_tokens) (default: 1024)."),
    query_tokens: Optional[int] = typer.Option(None, "--query-tokens", help="Budget of the question (default: the profile's, 1024)."),
    batch_docs: int = typer.Option(16, "--batch-docs", help="Samples per batch (and per flush of results)."),
    window: Optional[int] = typer.Option(None, "--window", help="Baselines' context window (default: the profile's budgets.baseline_window, else the model's)."),
    passage_tokens: int = typer.Option(512, "--passage-tokens", help="rag-bm25 passage size."),
    limit: Optional[int] = typer.Option(None, "--limit", help="At most this many samples per data file."),
    temperature: Optional[float] = typer.Option(None, "--temperature", help="0 = greedy (default: the profile's, 0)."),
    top_p: Optional[float] = typer.Option(None, "--top-p", help="Nucleus sampling (default: the profile's, 1.0)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Sampling seed (default: the profile's, none)."),
    device: str = typer.Option("auto", "--device", help="transformers backend: auto | cpu | cuda | mps"),
    dtype: str = typer.Option("auto", "--dtype", help="transformers / vllm backend: auto | float32 | bfloat16 | float16"),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="openai backend: server URL."),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="openai (and vllm) backend: tokenizer (HF id or path)."),
    max_concurrency: int = typer.Option(8, "--max-concurrency", help="openai backend: requests in flight at once."),
    request_timeout: float = typer.Option(600.0, "--request-timeout", help="openai backend: seconds one try may take in all (connect, send, every byte of the reply)."),
    max_retries: int = typer.Option(4, "--max-retries", help="openai backend: retries on 5xx, 429, timeouts and refused connections."),
    tensor_parallel: int = typer.Option(1, "--tensor-parallel", help="vllm backend: tensor-parallel size (GPUs)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="One line per finished sample on stderr."),
    repeats: Optional[int] = typer.Option(None, "--repeats", help="[default: the profile's, 1] Runs of each sample, with seeds seed+0 .. seed+N-1; table cells show mean ± standard error."),
    retry_failed: bool = typer.Option(False, "--retry-failed", help="Run again the samples recorded as failed."),
    max_failures: Optional[int] = typer.Option(None, "--max-failures", help="Stop once this many samples have failed in this run."),
    rescore: bool = typer.Option(False, "--rescore", help="Recompute every score from the stored replies; no model is loaded."),
    golds: Optional[str] = typer.Option(None, "--golds", help="[default: the profile's, all] Score against all golds (best of) or the first gold only: all | first."),
    empty_prediction: Optional[str] = typer.Option(None, "--empty-prediction", help="[default: the profile's, zero] A prediction empty once normalised: zero (scores 0) | text (the official raw substring rule)."),
    failed: Optional[str] = typer.Option(None, "--failed", help="[default: the profile's, wrong] Failed samples in the means: wrong (count 0) | skip (left out)."),
) -> None:
    """Score methods over tasks and lengths; writes results.jsonl, table.md (paper Table 1) and plots."""
    options = dict(locals())
    from memagent.eval.sweep import EvalOptions, run_eval
    from memagent.flags import check_flags, split_list

    check_flags(options)
    options["data"] = split_list(data, "--data")
    options["methods"] = split_list(methods, "--methods")
    _check_eval_out(out, options["data"])
    options["out"] = str(out)
    typer.echo(run_eval(EvalOptions(**_split_backend_options(options))))


@app.command("train", context_settings={"help_option_names": ["-h", "--help"]})
def train_cmd(
    config: Path = typer.Argument(..., help="YAML file of TrainConfig fields (see memagent.rl.config)."),
    overrides: Optional[list[str]] = typer.Argument(None, help="key=value overrides, dotted for nested fields: loss.kl_coef=0 rollout.group_size=8"),
    resume: bool = typer.Option(False, "--resume", help="Continue from the latest checkpoint in out_dir."),
    profile: Optional[Path] = typer.Option(None, "--profile", help="Protocol profile (YAML): its prompts and budgets set agent.*; agent.* overrides win. Written to out_dir/profile.yaml."),
    force: bool = typer.Option(False, "--force", help="Write into an out_dir that holds a model or another run."),
) -> None:
    """Train with Multi-Conv DAPO. Several processes: torchrun --nproc-per-node N -m memagent.cli train ..."""
    from memagent.profile import load_profile, train_config_with_profile, write_profile
    from memagent.config import ConfigError
    from memagent.rl.config import check_out_dir, load_config, parse_overrides
    from memagent.rl.trainer import train

    cfg = load_config(config, list(overrides or []) + (["resume=true"] if resume else [])
                      + (["force=true"] if force else []))
    explicit = set(parse_overrides(list(overrides or [])).get("agent", {}))
    cfg, resolved = train_config_with_profile(cfg, load_profile(profile) if profile else None, explicit)
    check_out_dir(cfg)  # before anything is written there (the model's own folder is refused)
    if cfg.data and not Path(cfg.data).is_file():
        raise ConfigError(f"data file {cfg.data} does not exist; give a JSONL of {{id, question, answers, context}}")
    if int(os.environ.get("RANK", "0")) == 0:
        write_profile(resolved, Path(cfg.out_dir) / "profile.yaml")
    result = train(cfg)
    if result.checkpoint is not None and int(os.environ.get("RANK", "0")) == 0:
        typer.echo(f"trained {len(result.metrics)} step(s); checkpoint: {result.checkpoint}")



@app.command()
def demo(
    quick: bool = typer.Option(False, "--quick", help="The reduced version (CI): fewer lengths, documents and steps."),
    seed: int = typer.Option(0, "--seed", help="Seed of data, initialisation and sampling."),
    out: Path = typer.Option(Path("runs/demo"), "--out", help="Directory for results.json, accuracy.png and model/."),
    seeds: Optional[str] = typer.Option(None, "--seeds", help="Run every seed of this list (e.g. 100,101,102,103,104, "
                                        "the evaluation seeds) into OUT/seed-S and write OUT/seeds.md: mean ± sd (min)."),
    jobs: int = typer.Option(1, "--jobs", min=1, help="With --seeds: seeds run at once (the cores are shared out)."),
    pure_dapo: bool = typer.Option(False, "--pure-dapo", help="The ablation: Multi-Conv DAPO alone, without the "
                                   "demo's value-copy loss (rl_copy_coef 0)."),
) -> None:
    """The paper reproduced at CPU scale: toy task, warm-up (no-RL ablation), Multi-Conv DAPO,
    full-context baseline, length sweep, table."""
    if seeds is not None:
        from memagent.demo.seeds import run_seeds

        summary = run_seeds(_int_list(seeds, "--seeds", minimum=0), out, quick=quick, jobs=jobs,
                            log=lambda m: typer.echo(m, err=True), pure_dapo=pure_dapo)
        from memagent.demo.seeds import markdown

        typer.echo(markdown(summary))
        return
    from memagent.demo.pipeline import DemoConfig, run_demo
    from memagent.flags import check_flags
    from memagent.io import check_output_dir

    check_flags(dict(seed=seed))
    check_output_dir(out, "--out")
    from memagent.lock import run_lock

    with run_lock(out, "demo"):  # one demo per --out
        run_demo(DemoConfig.for_run(quick, seed, str(out), pure_dapo=pure_dapo))


def _one_line(text: str) -> str:
    return " ".join(line.strip() for line in str(text).splitlines() if line.strip())


def _fail(message: str) -> int:
    typer.echo(f"error: {_one_line(message)}", err=True)
    return 2


def run(args: Optional[list[str]] = None) -> int:
    """Run the CLI on `args` (default sys.argv[1:]); returns the exit code.

    Every user-caused failure is one `error: ...` line and code 2: a `MemAgentError`, a bad flag
    (click's usage errors), an OS error the user can fix (permission, missing folder, disk full, a
    path under a file, ...) and text that is not UTF-8. Anything else is a bug: its traceback, then a
    line asking to report it, and code 1.
    """
    from memagent.errors import MemAgentError
    from memagent.io import os_error_message

    usage_errors, aborts = _click_exceptions()
    try:
        code = app(args=args, prog_name="memagent", standalone_mode=False)
    except usage_errors as e:
        if type(e).__name__ == "NoArgsIsHelpError":  # `memagent` alone: the help text
            typer.echo(e.format_message(), err=True)
            return 2
        ctx = getattr(e, "ctx", None)
        hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        return _fail(e.format_message() + hint)
    except aborts:
        typer.echo("aborted", err=True)
        return 1
    except MemAgentError as e:
        return _fail(str(e))
    except UnicodeDecodeError as e:
        return _fail(f"an input is not valid UTF-8 text (byte {e.start}: {e.reason}); save it as UTF-8")
    except OSError as e:
        if e.errno == errno.EPIPE:  # the reader of stdout went away (e.g. `| head`)
            return 1
        message = os_error_message(e)
        if message is None:
            return _bug()
        return _fail(message)
    except KeyboardInterrupt:
        code = 130
    except Exception:  # noqa: BLE001  (the last resort: a bug)
        return _bug()
    if code == 130:
        typer.echo("interrupted", err=True)
    return code if isinstance(code, int) else 0


def _click_exceptions() -> tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]]:
    """(usage errors, aborts) of click and of the click copy newer typer versions carry (typer._click)."""
    usage: list[type[BaseException]] = []
    aborts: list[type[BaseException]] = [typer.Abort]
    try:
        import click

        usage.append(click.exceptions.ClickException)
        aborts.append(click.exceptions.Abort)
    except ImportError:
        pass
    try:
        from typer._click import exceptions as vendored  # typer >= 0.2x

        usage.append(vendored.ClickException)
        aborts.append(getattr(vendored, "Abort", typer.Abort))
    except ImportError:
        pass
    return tuple(usage), tuple(aborts)


def _bug() -> int:
    traceback.print_exc()
    typer.echo(f"memagent hit an internal error (a bug, not a problem with your input); please report it "
               "(open an issue on the project) with the command you ran and the traceback above", err=True)
    return 1


def main() -> None:
    """Entry point: known errors become one clear line on stderr and exit code 2."""
    _quiet_libraries()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    sys.exit(run())


if __name__ == "__main__":
    main()
