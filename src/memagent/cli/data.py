"""`memagent data ...`: synthesize evaluation and training data (JSONL), or import released files."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from memagent.cli.app import app, int_list
from memagent.errors import InputError
from memagent.flags import check_flags
from memagent.io import check_output_file
from memagent.tasks.ruler import write_ruler
from memagent.tasks.ruler_hqa import FilterOptions, write_ruler_hqa
from memagent.tasks.schema import import_released, write_samples
from memagent.tasks.toy import ToySpec, iter_samples

data_app = typer.Typer(no_args_is_help=True, help="Synthesize evaluation and training data (JSONL), or import released files.")
app.add_typer(data_app, name="data")


_LIST_FLAGS = {"chunks": "--chunks", "tokens": "--tokens", "num_docs": "--num-docs"}
TOY_MAX_CHUNKS = 10_000_000  # --samples x the sum of --chunks: about 300 MB of toy text


def _check_data_flags(values: dict, inputs: dict) -> None:
    """A data command's counts (lists too, each within its bound) and its --out: writable and none of its
    input files."""
    scalars = {k: v for k, v in values.items() if k not in inputs and k != "out" and k not in _LIST_FLAGS}
    lists = {k: int_list(values[k], flag) for k, flag in _LIST_FLAGS.items() if k in values}
    check_flags({**scalars, **lists})
    if "chunks" in lists and values["samples"] * sum(lists["chunks"]) > TOY_MAX_CHUNKS:
        raise InputError(f"--samples {values['samples']} x --chunks {values['chunks']} is "
                         f"{values['samples'] * sum(lists['chunks']):,} chunks, over the limit of {TOY_MAX_CHUNKS:,} "
                         "(about 300 MB of text); ask for fewer samples or shorter documents")
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
    _check_data_flags(locals(), {"--source": source})
    filt = FilterOptions(models=tuple(filter_model or ()), backend=filter_backend,
                         base_urls=tuple(filter_base_url or ()),
                         replies=filter_replies, temperature=filter_temperature, top_p=filter_top_p,
                         max_tokens=filter_max_tokens, rules=tuple(filter_rule or ("sub_em",)))
    n = write_ruler_hqa(source, out, samples=samples, seed=seed, num_docs=int_list(num_docs, "--num-docs"),
                        tokens=int_list(tokens, "--tokens"), tokenizer=tokenizer, filter=filt, placement=placement,
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
    _check_data_flags(locals(), {"--source": source, "--haystack-file": haystack_file})

    n = write_ruler(task, out, tokens=int_list(tokens, "--tokens"), samples=samples, seed=seed, tokenizer=tokenizer,
                    haystack_file=haystack_file, haystack=haystack, source=source)
    typer.echo(f"wrote {n} samples to {out}", err=True)


@data_app.command("import")
def data_import(
    src: Path = typer.Argument(..., help="A released file: eval_{N}.json, training parquet, RULER or LongBench JSON(L)."),
    out: str = typer.Option(..., "--out", help="JSONL file to write (- for stdout)."),
    source: Optional[str] = typer.Option(None, "--source", help="The HotpotQA dev JSON that index contexts point into (eval_{N}.json, N >= 12800)."),
) -> None:
    """Convert a released data file to our sample JSONL (format detected; docs/data.md)."""
    _check_data_flags(dict(out=out), {"--source": source})  # --out = SRC is refused by import_released itself
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
    two_hop: bool = typer.Option(False, "--two-hop", help="Two-hop questions: a pointer fact 'fact A B' and a "
                                 "value fact 'fact B V' in two random chunks; each sample records its order."),
) -> None:
    """The toy long-context QA family of the CPU-scale demo (each word one token of the toy tokenizer)."""
    _check_data_flags(locals(), {})
    try:
        spec = ToySpec(n_keys=keys, n_values=values, facts=facts, slots=slots)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    lengths = int_list(chunks, "--chunks")
    if two_hop and (min(lengths, default=2) < 2 or keys < facts + 2):
        raise typer.BadParameter("--two-hop needs --chunks of at least 2 (one chunk per fact) and --keys of at "
                                 "least --facts + 2")
    n = write_samples(iter_samples(spec, lengths, samples, seed, two_hop=two_hop), out)
    typer.echo(f"wrote {n} samples to {out} (chunk_tokens for the toy tokenizer: {spec.chunk_tokens})", err=True)

