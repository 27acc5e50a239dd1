"""The figures of README.md, bench/README.md and docs/ against their results JSON (scripts/docs_figures.py, `make docs`):
the repository's pages agree; a page with one figure edited fails, naming its line; the renderers on hand-made JSON."""
from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from memagent.demo.report import print_table

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("docs_figures", ROOT / "scripts" / "docs_figures.py")
figures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(figures)


def fake(data: dict):
    return lambda name: data[name]


def line_of(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if needle in line)


def test_the_repository_pages_agree_with_their_json(capsys):
    assert figures.main(["--check"]) == 0, capsys.readouterr().out
    assert capsys.readouterr().out.strip().endswith("figures: 0 difference(s) in %d page(s)" % len(figures.pages()))


def test_every_region_is_on_a_page_and_every_page_region_is_known():
    used = figures.used_regions(figures.pages())
    assert used == set(figures.REGIONS)
    assert set(figures.SOURCES) == set(figures.REGIONS)


def copy(tmp_path: Path, page: str) -> Path:
    dst = tmp_path / Path(page).name
    shutil.copy(ROOT / page, dst)
    return dst


def edit(path: Path, old: str, new: str) -> int:
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new), encoding="utf-8")
    return line_of(path, new)


def test_an_edited_demo_figure_in_the_readme_fails_naming_its_line(tmp_path, capsys):
    page = copy(tmp_path, "README.md")
    line = edit(page, "| memagent-rl | 99.8 ± 0.5 (98.8) |", "| memagent-rl | 99.7 ± 0.5 (98.8) |")
    assert figures.main(["--check", str(page)]) == 1
    out = capsys.readouterr().out
    print(out)  # shown with pytest -s: the failing check's own words
    assert f"{page}:{line}: expected '| memagent-rl | 99.8 ± 0.5 (98.8) |" in out
    assert "found '| memagent-rl | 99.7 ± 0.5 (98.8) |" in out
    assert "figures: 1 difference(s) in 1 page(s)" in out


def test_an_edited_seed_0_cell_fails(tmp_path, capsys):
    page = copy(tmp_path, "README.md")
    line = edit(page, "│ memagent-no-rl │     28.5 │", "│ memagent-no-rl │     28.4 │")
    assert figures.main(["--check", str(page)]) == 1
    assert f"{page}:{line}: expected '│ memagent-no-rl │     28.5 │" in capsys.readouterr().out


def test_the_old_packing_figure_of_bench_readme_fails(tmp_path, capsys):
    """issue 25: bench/README.md once said packing 1.376 and "met: no" where packing.json says 1.67."""
    page = copy(tmp_path, "bench/README.md")
    text = page.read_text(encoding="utf-8")
    row = next(r for r in text.splitlines() if r.startswith("| `packing_speedup` | 1.67 "))
    stale = row.replace("| 1.67 ", "| 1.376 ", 1).replace("| yes |", "| no |", 1)
    line = edit(page, row, stale)
    assert figures.main(["--check", str(page)]) == 1
    out = capsys.readouterr().out
    assert f"{page}:{line}: expected '| `packing_speedup` | 1.67 " in out and "found '| `packing_speedup` | 1.376 " in out


def test_an_edited_inline_figure_fails(tmp_path, capsys):
    page = copy(tmp_path, "docs/scaling.md")
    line = edit(page, "-->1.97x**", "-->2.00x**")
    assert figures.main(["--check", str(page)]) == 1
    out = capsys.readouterr().out
    assert f"{page}:{line}: figure ray.headline.ray_scaling_2: expected 1.97, found 2.00" in out


def test_generating_repairs_the_edited_page(tmp_path):
    page = copy(tmp_path, "docs/benchmarks.md")
    good = page.read_text(encoding="utf-8")
    edit(page, "| 3.19x |", "| 3.91x |")
    assert figures.main([str(page)]) == 0
    assert page.read_text(encoding="utf-8") == good


# --- the renderer on hand-made JSON ------------------------------------------------------------------------

def test_a_region_is_rendered_from_its_json():
    runs = [{"tokens": 16384, "calls": 5, "wall_s": 17.94, "backend_s": 3.26, "peak_rss_mb": 437.4},
            {"tokens": 1048576, "calls": 257, "wall_s": 175.4, "backend_s": 156.6, "peak_rss_mb": 441.0}]
    page = "before\n<!-- figures:bench-scaling -->\nanything\n<!-- /figures:bench-scaling -->\nafter\n"
    out = figures.render(page, fake({"scaling": {"runs": runs}}))
    assert out == ("before\n<!-- figures:bench-scaling -->\n"
                   "| tokens | calls | wall s | in backend s | peak RSS MB |\n|---|---|---|---|---|\n"
                   "| 16,384 | 5 | 17.9 | 3.3 | 437 |\n| 1,048,576 | 257 | 175.4 | 156.6 | 441 |\n"
                   "<!-- /figures:bench-scaling -->\nafter\n")


def test_an_inline_figure_keeps_the_pages_precision_separator_and_scale():
    get = fake({"ray": {"headline": {"r": 1.9716}, "runs": [{"n": 11856.0}]}, "chunker": {"s": 586754.4}})
    text = ("a <!-- figure:ray.headline.r -->2.00x, b <!-- figure:ray.runs.0.n -->1,000 tokens, "
            "c <!-- figure:chunker.s/1000 -->1K, d <!-- figure:ray.headline.r*100 -->5%")
    assert figures.render(text, get) == ("a <!-- figure:ray.headline.r -->1.97x, b <!-- figure:ray.runs.0.n -->11,856 "
                                         "tokens, c <!-- figure:chunker.s/1000 -->587K, d "
                                         "<!-- figure:ray.headline.r*100 -->197%")


def test_check_names_each_differing_line(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("x\n<!-- figures:bench-cost-model -->\n| old |\n<!-- /figures:bench-cost-model -->\n"
                    "slope <!-- figure:scaling.slope -->0.50\n", encoding="utf-8")
    runs = [{"tokens": 2048, "chunks": 1, "flops_ratio": 0.877, "full_s": 0.109, "memagent_s": 0.267, "time_ratio": 0.41}]
    problems = figures.check([page], fake({"cost_model": {"runs": runs}, "scaling": {"slope": 0.5584}}), root=tmp_path)
    assert problems[0] == ("p.md:3: expected '| tokens | chunks | FLOPs full / MemAgent | full s | MemAgent s | "
                           "time full / MemAgent |', found '| old |'")
    assert problems[-1] == "p.md:5: figure scaling.slope: expected 0.56, found 0.50"


@pytest.mark.parametrize("text, says", [
    ("<!-- figures:nope -->\n<!-- /figures:nope -->\n", "p.md:1: unknown figures region 'nope'"),
    ("<!-- figures:bench-scaling -->\n| a |\n", "p.md:1: region 'bench-scaling' is never closed"),
    ("| a |\n<!-- /figures:bench-scaling -->\n", "p.md:2: /figures:bench-scaling closes no open region"),
])
def test_broken_markers_are_named(tmp_path, text, says):
    page = tmp_path / "p.md"
    page.write_text(text, encoding="utf-8")
    assert figures.check([page], fake({}), root=tmp_path) == [says]


def test_the_latest_figures_table_says_when_a_target_is_missed():
    base = {"machine": {"date": "2026-01-01 00:00 UTC", "load_avg": [1.0, 2.0, 3.0]}}
    data = {name: {**base, "headline": {}, "targets": {}} for name in ("scaling", "overhead", "batching", "chunker",
                                                                       "trainer_vs_trl")}
    for key, src in (("scaling_slope", "scaling"), ("rss_ratio_1m_16k", "scaling"), ("overhead_ratio", "overhead"),
                     ("batching_speedup", "batching"), ("chunker_ratio", "chunker"), ("trainer_vs_trl", "trainer_vs_trl")):
        data[src]["headline"][key], data[src]["targets"][key] = 1.0, ">= 1.5"
    latest = figures.LATEST
    try:
        figures.LATEST = latest[:6]
        out = figures.bench_latest(fake(data))
    finally:
        figures.LATEST = latest
    assert "| `batching_speedup` | 1.000 | >= 1.5 | **no** | 2026-01-01 00:00 UTC | 1.0/2.0/3.0 |" in out


def test_the_seed_0_table_is_the_demos_printed_table(capsys):
    results = {"seed": 3, "chance": 0.02, "config": {"train_chunks": 2},
               "accuracy": {"memagent-rl": {"1": 1.0, "4": 0.5}, "full-context": {"1": 0.25, "4": 0.0}},
               "seconds": {"data": 1.2, "total": 9.6}}
    out = figures.seed0_table(results)
    print_table(results, SimpleNamespace(train_chunks=2))  # what `memagent demo` prints
    printed = "\n".join(line.rstrip() for line in capsys.readouterr().out.splitlines()) + "\n"
    assert out == printed
    assert "toy QA accuracy (%), seed 3; chance 2%" in out and "8 chunks" in out and "│     50.0 │" in out
    assert out.endswith("seconds: data 1, total 10\n")


def test_the_eval_seeds_region_quotes_the_checks():
    seeds = ["1", "2"]
    cell = {"mean": 50.0, "sd": 1.0, "min": 49.0, "n": 2}
    acc = {m: {x: cell for x in ("1", "16", "256")} for m in ("memagent-rl", "memagent-no-rl", "full-context")}
    checks = {"rl_minus_no_rl_1x": dict(zip(seeds, [70.0, 80.0])), "rl_drop_16x": dict(zip(seeds, [0.0, 1.0])),
              "rl_drop_256x": dict(zip(seeds, [2.0, 4.0])), "full_context_1x": dict(zip(seeds, [100.0, 100.0])),
              "full_context_max_from_16x": dict(zip(seeds, [9.0, 12.5]))}
    s = {"seeds": [1, 2], "accuracy": acc, "checks": checks, "peak_rss_mb": {"1": 600, "2": 700}}
    out = figures.readme_eval_seeds(fake({"demo_seeds": s, "demo_seeds_pure": s}))
    assert "RL − no-RL at 1x 70.0-80.0 (mean 75.0)" in out
    assert "at 256x 2.0-4.0 (mean 3.0)" in out
    assert "at most 12.5 from 16x on (seed 2 at 16x" in out
    assert "Peak RSS ~650 MB a seed" in out and "evaluation seeds 1-2" in out


def test_demo_numerics_rows_whose_settings_disagree_are_refused():
    settings = json.loads((ROOT / "bench" / "results" / "demo_numerics.json").read_text())["settings"]
    settings = {**settings, "MKL_CBWR=AVX512_E2": {**settings["MKL_CBWR=AVX512_E2"], "no_rl_1x": 30.0}}
    with pytest.raises(ValueError, match="disagree"):
        figures.demo_numerics_table(fake({"demo_numerics": {"settings": settings}}))


def test_a_path_reads_lists_and_their_median():
    data = {"runs": [{"s": [3.0, 1.0, 2.0]}]}
    assert figures.at(data, "runs.0.s.1") == 1.0 and figures.at(data, "runs.0.s.median") == 2.0


def test_format_like():
    assert figures.format_like(1.9716, "2.00") == "1.97"
    assert figures.format_like(11856.0, "9,999") == "11,856"
    assert figures.format_like(440.6, "430") == "441"


def test_summary_json_repeats_the_benchmarks_own_headlines():
    """docs/benchmarks.md reads summary.json, bench/README.md each benchmark's JSON: the two must say the same."""
    results = ROOT / "bench" / "results"
    headlines = {}
    for path in results.glob("*.json"):
        headlines.update(json.loads(path.read_text(encoding="utf-8")).get("headline", {}))
    summary = json.loads((results / "summary.json").read_text(encoding="utf-8"))
    assert {k: v for k, v in summary.items() if headlines.get(k) != v} == {}


def recipe_cell(accuracy: float, se: float) -> dict:
    return dict(accuracy=accuracy, se=se, gold_in_raw=accuracy, n=12, calls_per_doc=65.0, seconds_per_doc=100.0)


def test_the_recipe_says_whether_rl_beats_the_warm_up_beyond_its_noise():
    table = {"rl": {"vt": {"32768": recipe_cell(85.0, 4.4)}, "niah_single_2": {"32768": recipe_cell(50.0, 5.0)},
                    "niah_multikey_1": {"32768": recipe_cell(20.0, 2.0)}},
             "warmup2": {"vt": {"32768": recipe_cell(83.3, 4.1)}, "niah_single_2": {"32768": recipe_cell(40.0, 9.0)},
                         "niah_multikey_1": {"32768": recipe_cell(25.0, 3.0)}}}
    lines = figures.recipe_verdicts(table, ["niah_single_2", "niah_multikey_1", "vt"], ["2048", "32768"])
    ahead = [line for line in lines if "RL ahead" in line]
    # 85.0 - 83.3 = 1.7 <= 4.4; 50 - 40 = 10 > 9.0; 20 - 25 = -5, |5| > 3.0
    assert ahead == [
        "- niah_single_2: RL ahead of the warm-up alone at the longest length: 50.0 vs 40.0 (yes, beyond a standard "
        "error, se 9.0)",
        "- niah_multikey_1: RL ahead of the warm-up alone at the longest length: 20.0 vs 25.0 (no, beyond a standard error, se 3.0)",
        "- vt: RL ahead of the warm-up alone at the longest length: 85.0 vs 83.3 (yes, within a standard error, se 4.4)"]


def test_the_recipe_page_lists_rl_against_the_warm_up_document_by_document():
    table = {"rl": {"vt": {"2048": recipe_cell(90.0, 3.0)}}, "warmup2": {"vt": {"2048": recipe_cell(80.0, 3.0)}}}
    data = {"table": table, "stages": {},
            "paired": {"rl_vs_warmup2": {"vt": {"2048": dict(n=32, higher=3, lower=1, equal=28),
                                                "32768": dict(n=12, higher=0, lower=2, equal=10)}}}}
    page = figures.real_model_recipe(fake({"real_model_recipe": data}))
    assert "- vt: 1x 3 / 1 / 28 of 32; 16x 0 / 2 / 10 of 12" in page.splitlines()
    assert not any(line.startswith("- niah_single_2: 1x") for line in page.splitlines())


def test_the_recipe_sets_a_later_rl_run_against_the_round_it_continued():
    table = {"rl7": {"vt": {"32768": recipe_cell(90.0, 4.0)}}, "warmup7": {"vt": {"32768": recipe_cell(80.0, 6.0)}}}
    lines = figures.recipe_verdicts(table, ["vt"], ["2048", "32768"])
    # rl (not run) is still named, rl7 set against warmup7: 90 - 80 = 10 > 6.0
    assert "- vt: RL ahead of the warm-up alone at the longest length: not measured yet" in lines
    assert ("- vt: RL from round 7 (rl7) ahead of round 7 alone at the longest length: 90.0 vs 80.0 (yes, beyond a "
            "standard error, se 6.0)") in lines
    assert "- rl7 at 1x, averaged over the tasks, at least 80%: not measured yet" in lines
    data = {"table": table, "stages": {},
            "paired": {"rl7_vs_warmup7": {"vt": {"32768": dict(n=12, higher=2, lower=1, equal=9)}}}}
    page = figures.real_model_recipe(fake({"real_model_recipe": data})).splitlines()
    assert "- vt: 16x 2 / 1 / 9 of 12" in page
    assert any(line.startswith("Warm-up round 7 + RL") and line.endswith("RL from round 7 higher / lower / equal")
               for line in page)


def test_the_recipe_page_says_what_niah_multikey_1_answered_when_wrong():
    cell16 = {**recipe_cell(50.0, 15.1), "wrong": dict(n=6, distractor=6, before_gold=5, by_chance=2.67, other=0)}
    table = {"rl7": {"niah_multikey_1": {"32768": cell16, "2048": recipe_cell(65.6, 8.5)}}}
    page = figures.real_model_recipe(fake({"real_model_recipe": {"table": table, "stages": {}}})).splitlines()
    assert "- rl7 16x: 6 wrong: 6 a distractor's value (5 read before the queried needle; by chance 2.67) / 0 other" in page
    assert not any(line.startswith("- rl7 1x:") for line in page)  # a cell without the breakdown lists nothing
