"""Bad output paths and sizes (issue 24, classes 8, 9, 13, 15, and `demo --out MODEL_DIR`): each ends in exit code
2, exactly one `error:` line, no traceback, every input file byte-identical, before any work is done. In process,
through `memagent.cli.run`, in the style of tests/test_bad_inputs.py (its `world` fixture and `_digests`)."""
from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pytest

from memagent.cli import run
from test_bad_inputs import ASK, EVAL, MANY, TOY, _digests, _jsonl, world  # noqa: F401  (world: a fixture)
from test_reference import _tree

PROFILE = Path(__file__).resolve().parents[1] / "configs" / "profiles" / "memagent.yaml"


@pytest.fixture(scope="module")
def pw(world):  # noqa: F811  (the fixture imported above)
    """`world` plus the inputs of these cases: files named like the side files a command writes."""
    w = world / "paths"
    w.mkdir()
    shutil.copy(PROFILE, w / "x.profile.yaml")  # ask --output x.jsonl writes x.profile.yaml beside it
    (w / "notes.txt").write_bytes(b"my notes\nthe last line has no newline")  # not JSONL: never trimmed
    toy = [json.loads(line) for line in (world / "toy.jsonl").read_text().splitlines()]
    for sub, name in (("ev1", "summary.json"), ("ev2", "table.md"), ("ev3", "scores_toy.png")):
        (w / sub).mkdir()
        _jsonl(w / sub / name, toy)  # a data file where eval writes a side file
    (w / "ev4").mkdir()
    shutil.copy(PROFILE, w / "ev4" / "profile.yaml")
    _tree(w / "ref")  # a checkout in the official repository's shape
    (w / "cfg").mkdir()
    (w / "cfg" / "config.json").write_text('{"my": "own settings"}\n')  # not a model: tiny-model must not replace it
    sentence = "The river runs past the old stone city and on to the sea. "
    (w / "big_haystack.txt").write_text(sentence * (17_000_000 // len(sentence) + 1))  # over the 16 MiB bound
    return w


CASES = [
    # class 13: side files checked against every input before anything is written or trimmed
    ("ask-profile-side-file-is-profile", [*MANY, "--output", "{p}/x.jsonl", "--profile", "{p}/x.profile.yaml"],
     "--output (its profile x.profile.yaml)"),
    ("ask-output-not-jsonl", [*MANY, "--output", "{p}/notes.txt"], "is not a JSONL file of `memagent ask` results"),
    ("eval-data-is-summary", [*EVAL[:4], "{p}/ev1/summary.json", "--out", "{p}/ev1", "--no-progress"],
     "--out (its summary.json)"),
    ("eval-data-is-plot", [*EVAL[:4], "{p}/ev3/scores_toy.png", "--out", "{p}/ev3", "--no-progress"],
     "would get plots named like"),
    ("eval-profile-in-out", [*EVAL[:4], "{w}/toy.jsonl", "--out", "{p}/ev4", "--profile", "{p}/ev4/profile.yaml",
                             "--no-progress"], "--out (its profile.yaml)"),
    ("reference-out-inside-tree", ["profile", "from-reference", "{p}/ref", "--out",
                                   "{p}/ref/taskutils/memory_eval/utils/envs.py"], "inside the reference checkout"),
    ("tiny-over-config", ["tiny-model", "{p}/cfg"], "already holds config.json"),
    # class 15: an empty path means nothing
    ("tiny-empty", ["tiny-model", ""], "DIR is empty"),
    ("demo-out-empty", ["demo", "--out", ""], "--out is empty"),
    ("train-out-dir-empty", ["train", "{w}/train.yaml", "out_dir=", "progress=false"], "out_dir is empty"),
    ("serve-state-dir-empty", ["serve", "--model", "{m}", "--state-dir", ""], "--state-dir is empty"),
    ("ask-output-empty", [*MANY, "--output", ""], "--output is empty"),
    ("report-out-empty", ["report", "{w}/in.jsonl", "--out", ""], "--out is empty"),
    # class 19: demo --out a model's folder (train refuses it)
    ("demo-out-model", ["demo", "--quick", "--out", "{m}"], "holds a model"),
    # class 8: sizes that would never finish
    ("eval-repeats-huge", [*EVAL, "--repeats", "1000000000"], "--repeats 1000000000 is over the limit of 1,000"),
    ("toy-chunks-huge", [*TOY[:3], "1000000000", *TOY[4:]], "--chunks 1000000000 is over the limit"),
    ("toy-samples-huge", [*TOY[:5], "1000000000", *TOY[6:]], "--samples 1000000000 is over the limit"),
    ("toy-product-huge", ["data", "toy", "--chunks", "50000,50000", "--samples", "1000", "--out", "{w}/o.jsonl"],
     "over the limit of 10,000,000"),
    ("ruler-tokens-huge", ["data", "ruler", "--task", "vt", "--tokens", "1000000000", "--tokenizer", "tiny",
                           "--out", "{w}/o.jsonl"], "--tokens 1000000000 is over the limit"),
    ("ruler-haystack-huge", ["data", "ruler", "--task", "niah_single_2", "--tokens", "300", "--tokenizer", "tiny",
                             "--samples", "1", "--haystack-file", "{p}/big_haystack.txt", "--out", "{w}/o.jsonl"],
     "over the limit of 16,777,216"),
]


def _argv(args: list[str], w: Path, p: Path, m: str) -> list[str]:
    return [a.replace("{p}", str(p)).replace("{w}", str(w)).replace("{m}", m) for a in args]


@pytest.mark.parametrize("args, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_path_or_size(args, message, world, pw, tiny_model_dir, capsys, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.chdir(tmp_path)  # an empty path must not write here
    before = _digests(world, Path(tiny_model_dir))
    code = run(_argv(args, world, pw, str(tiny_model_dir)))
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    lines = [line for line in (out + err).splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and message in lines[0], (out, err)
    assert "Traceback" not in out + err
    assert _digests(world, Path(tiny_model_dir)) == before
    assert not list(world.rglob("*.tmp")) and not list(tmp_path.iterdir())


def test_a_second_train_resume_is_refused_by_the_lock_before_profile_yaml(world, tmp_path, capsys):  # noqa: F811
    """The lock is taken first: a second `train --resume --profile P` on a held out_dir leaves profile.yaml."""
    from memagent.lock import run_lock

    out = tmp_path / "run"
    out.mkdir()
    (out / "profile.yaml").write_text("# the running run's profile\n")
    ready, release = threading.Event(), threading.Event()

    def hold():
        with run_lock(out, "training run"):
            ready.set()
            release.wait(30)

    t = threading.Thread(target=hold)
    t.start()
    ready.wait(10)
    try:
        code = run(["train", str(world / "train.yaml"), f"out_dir={out}", "progress=false", "--resume",
                    "--profile", str(PROFILE)])
    finally:
        release.set()
        t.join()
    err = capsys.readouterr().err
    assert code == 2 and "another training run is writing to" in err, err
    assert (out / "profile.yaml").read_text() == "# the running run's profile\n"


def test_side_files_are_refused_when_they_are_inputs(tmp_path):
    """io.check_side_files: a side file that is an input, or a folder, is refused; nothing is written."""
    from memagent.io import OutputError, check_side_files

    doc = tmp_path / "a.profile.yaml"
    doc.write_text("keep me")
    with pytest.raises(OutputError, match="same path as --document"):
        check_side_files({"--output (its profile a.profile.yaml)": doc}, {"--document": doc})
    (tmp_path / "dir").mkdir()
    with pytest.raises(OutputError, match="is a folder"):
        check_side_files({"--output (its lock)": tmp_path / "dir"}, {})
    assert doc.read_text() == "keep me"


def test_a_one_line_document_streams_like_the_whole_text(tmp_path, tiny_tokenizer):
    """A 3 MB document of ONE line (no newline, no full stop) read as a stream gives the chunks of the whole text
    tokenised at once, in linear time (bench/bench_one_line.py measures 50 MB: one line and lines alike)."""
    import time

    from memagent.agent.chunking import iter_chunks

    words = ("river", "city", "the", "a", "house", "stone", "blue", "seven")
    text = " ".join(words[i % len(words)] for i in range(3_000_000 // 5))
    doc = tmp_path / "one_line.txt"
    doc.write_text(text)
    start = time.perf_counter()
    chunks = list(iter_chunks(doc, tiny_tokenizer, 512))
    seconds = time.perf_counter() - start
    whole = tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert [c.token_ids for c in chunks] == [whole[i:i + 512] for i in range(0, len(whole), 512)]
    assert [c.start_token for c in chunks] == list(range(0, len(whole), 512))
    assert seconds < 60, seconds
