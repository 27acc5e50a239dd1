"""Models and profiles that are not what they seem (issue 24, classes 5, 6, 16, 19), in the table style of
test_bad_inputs.py: each exits 2 with exactly one `error:` line, no traceback, and leaves every input as it
was (sha256 before and after). Damaged model folders are copies of the tiny model:
- tokenizer files missing (all, or only tokenizer.json): AutoTokenizer would build an empty tokenizer;
- config vocab_size 0, or smaller than the tokenizer: ids the embedding has no row for;
- a chat template with a syntax error, a `raise_exception`, a loop that never ends (time-bounded);
through ask, eval, train, `data ruler --tokenizer DIR` (tokenizer cases: it reads no template) and serve
(refused before it binds). Profiles with odd chat_template_kwargs and seeds through ask and eval;
`profile from-reference --baseline-input-tokens`; `flops` with more KV heads than heads. In process, through
`memagent.cli.run`, except the endless template, which runs in a child process under a wall-clock limit."""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_bad_inputs import _digests, world  # noqa: F401  (the fixture)
from test_reference import _tree

from memagent.cli import run

NESTED_LOOP = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
TEMPLATES = {
    "t_syntax": "{% for message in messages %}{{ message['content'] }",
    "t_raise": "{{ raise_exception('this template refuses every conversation') }}",
    "t_loop": NESTED_LOOP,
}


@pytest.fixture(scope="module")
def models(world, tiny_model_dir):  # noqa: F811
    """`world` plus damaged copies of the tiny model under models/, profiles and shapes under it too."""
    m = world / "models"
    m.mkdir()

    def copy(name: str, drop: tuple[str, ...] = (), **config) -> Path:
        d = shutil.copytree(tiny_model_dir, m / name)
        for f in drop:
            (d / f).unlink()
        if config:
            data = json.loads((d / "config.json").read_text())
            (d / "config.json").write_text(json.dumps({**data, **config}, indent=2))
        return d

    copy("nofiles", ("tokenizer.json", "tokenizer_config.json"))  # chat_template.jinja left
    copy("nojson", ("tokenizer.json",))
    copy("vocab0", vocab_size=0)
    copy("vocabsmall", vocab_size=500)  # the tokenizer has 774 tokens
    for name, text in TEMPLATES.items():
        (copy(name) / "chat_template.jinja").write_text(text)
    profiles = {
        "ctk_tokenize": "chat_template_kwargs: {tokenize: true}\n",
        "ctk_conversation": "chat_template_kwargs: {conversation: [{role: user, content: hi}]}\n",
        "ctk_agp": "chat_template_kwargs: {add_generation_prompt: false}\n",
        "ctk_recursive": "chat_template_kwargs:\n  loop: &a [1, *a]\n",
        "ctk_deep": "chat_template_kwargs:\n  deep: " + "[" * 40 + "]" * 40 + "\n",
        "ctk_huge": "chat_template_kwargs:\n  notes: " + "x" * 200_000 + "\n",
        "ctk_many": "chat_template_kwargs:\n  many: [" + ", ".join(["1"] * 5000) + "]\n",
        "seed_2_63": f"sampling: {{seed: {2**63 + 7}}}\n",
        "seed_neg": "sampling: {seed: -1}\n",
        "seed_2_32": f"sampling: {{seed: {2**32}}}\n",
    }
    for name, text in profiles.items():
        (m / f"{name}.yaml").write_text(text)
    (m / "kv.json").write_text(json.dumps({"num_hidden_layers": 2, "hidden_size": 64, "vocab_size": 100,
                                           "num_attention_heads": 4, "num_key_value_heads": 8,
                                           "intermediate_size": 128}))
    _tree(m / "ref")
    return m


ASK = ["ask", "--no-progress", "--document", "{w}/doc.txt", "--question", "q", "--model"]
EVAL = ["eval", "--no-progress", "--data", "{w}/toy.jsonl", "--out", "{w}/ev/{id}", "--model"]
SERVE = ["serve", "--device", "cpu", "--state-dir", "{w}/sv/{id}", "--port", "{port}", "--model"]
RULER = ["data", "ruler", "--task", "vt", "--tokens", "300", "--samples", "1", "--out", "{w}/ru/{id}.jsonl",
         "--tokenizer"]


def _train(model: str) -> list[str]:
    return ["train", "{w}/train.yaml", f"model={model}", "out_dir={w}/tr/{id}", "progress=false"]


M = "{w}/models/"
NO_FILES, NO_JSON = "has no vocabulary file", "has no vocabulary file"
MODEL_CASES = [
    # (name, folder, the error's words) -- the tokenizer files missing
    ("nofiles", "nofiles", NO_FILES),
    ("nojson", "nojson", NO_JSON),
    # the embedding and the tokenizer disagree
    ("vocab0", "vocab0", "has vocab_size 0 in config.json"),
    ("vocabsmall", "vocabsmall", "has 774 tokens but the model's embedding only 500"),
    # the chat template is broken code
    ("t_syntax", "t_syntax", "the model's chat template failed to render a prompt (TemplateSyntaxError"),
    ("t_raise", "t_raise", "this template refuses every conversation"),
]
TOKENIZER_ONLY = ("nofiles", "nojson")

CASES = [
    *[(f"ask-{n}", [*ASK, M + d], msg) for n, d, msg in MODEL_CASES],
    *[(f"eval-{n}", [*EVAL, M + d], msg) for n, d, msg in MODEL_CASES],
    *[(f"train-{n}", _train(M + d), msg) for n, d, msg in MODEL_CASES],
    *[(f"ruler-{n}", [*RULER, M + d], msg) for n, d, msg in MODEL_CASES if n in TOKENIZER_ONLY],
    # profiles: chat_template_kwargs that collide with apply_chat_template's own arguments, or are not flags
    *[(f"{cmd}-{p}", [*base, "{m}", "--profile", f"{M}{p}.yaml"], msg)
      for cmd, base in (("ask", ASK), ("eval", EVAL))
      for p, msg in (("ctk_tokenize", "tokenize is an argument of apply_chat_template"),
                     ("ctk_conversation", "conversation is an argument of apply_chat_template"),
                     ("ctk_agp", "add_generation_prompt is an argument of apply_chat_template"),
                     ("ctk_recursive", "nested more than 64 levels deep"),  # the bounded YAML reader
                     ("ctk_deep", "chat_template_kwargs.deep"),
                     ("ctk_huge", "more than 65536 characters"),
                     ("ctk_many", "more than 1000 values"),
                     ("seed_2_63", "sampling.seed must be in [0, 2**32)"),
                     ("seed_neg", "sampling.seed must be in [0, 2**32) (NumPy's limit) or null, got -1"),
                     ("seed_2_32", f"sampling.seed must be in [0, 2**32) (NumPy's limit) or null, got {2**32}"))],
    # values accepted without a check
    ("reference-baseline-neg", ["profile", "from-reference", M + "ref", "--baseline-input-tokens", "-5",
                                "--out", "{w}/pr/neg.yaml"], "--baseline-input-tokens must be a positive integer"),
    ("reference-baseline-0", ["profile", "from-reference", M + "ref", "--baseline-input-tokens", "0",
                              "--out", "{w}/pr/zero.yaml"], "got 0"),
    ("flops-kv-over-heads", ["flops", "--model", M + "kv.json"], "num_key_value_heads (8) must divide"),
]
SERVE_CASES = [(f"serve-{n}", [*SERVE, M + d], msg) for n, d, msg in MODEL_CASES]


def _argv(args: list[str], w: Path, m: str, case: str, port: int = 0) -> list[str]:
    return [a.replace("{w}", str(w)).replace("{m}", m).replace("{id}", case).replace("{port}", str(port))
            for a in args]


def _check(code: int, out: str, err: str, message: str, before: dict, w: Path, m: Path, case: str) -> None:
    assert code == 2, (out, err)
    lines = [line for line in (out + err).splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and message in lines[0], (out, err)
    assert "Traceback" not in out + err
    after = _digests(w, m)
    assert {k: v for k, v in after.items() if k in before} == before  # inputs byte-identical
    # nothing new but in the command's own output folder (where eval and train record their settings first)
    assert all(f"/{case}/" in k for k in set(after) - set(before)), sorted(set(after) - set(before))


@pytest.mark.parametrize("args, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_model_input(args, message, models, world, tiny_model_dir, capsys, request):  # noqa: F811
    before = _digests(world, Path(tiny_model_dir))
    code = run(_argv(args, world, str(tiny_model_dir), request.node.callspec.id))
    out, err = capsys.readouterr()
    _check(code, out, err, message, before, world, Path(tiny_model_dir), request.node.callspec.id)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("args, message", [c[1:] for c in SERVE_CASES], ids=[c[0] for c in SERVE_CASES])
def test_serve_refuses_a_bad_model_before_binding(args, message, models, world, tiny_model_dir, capsys,
                                                   monkeypatch, request):  # noqa: F811
    pytest.importorskip("fastapi")
    import uvicorn

    def tripwire(*_a, **_k):
        raise AssertionError("memagent serve started its server")

    monkeypatch.setattr(uvicorn, "run", tripwire)
    port = _free_port()
    before = _digests(world, Path(tiny_model_dir))
    code = run(_argv(args, world, str(tiny_model_dir), request.node.callspec.id, port))
    out, err = capsys.readouterr()
    _check(code, out, err, message, before, world, Path(tiny_model_dir), request.node.callspec.id)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # nothing listens there


# the endless template: the probe's bound is lowered to 2 s in a child process, which the test gives 120 s
CHILD = ("import sys, memagent.backends.chat as chat; chat.PROBE_SECONDS = 2.0; "
         "from memagent.cli import run; sys.exit(run(sys.argv[1:]))")
LOOP_CASES = [
    ("ask-t_loop", [*ASK, M + "t_loop"]),
    ("eval-t_loop", [*EVAL, M + "t_loop"]),
    ("train-t_loop", _train(M + "t_loop")),
    ("serve-t_loop", [*SERVE, M + "t_loop"]),
]


@pytest.mark.parametrize("args", [c[1] for c in LOOP_CASES], ids=[c[0] for c in LOOP_CASES])
def test_an_endless_chat_template_is_stopped_by_the_probe(args, models, world, tiny_model_dir, request):  # noqa: F811
    """The command ends within the probe's time bound (plus start-up), one error line; serve never binds (the
    port is refused to nothing, since the probe runs before the server starts)."""
    before = _digests(world, Path(tiny_model_dir))
    argv = _argv(args, world, str(tiny_model_dir), request.node.callspec.id, _free_port())
    start = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("the command rendered the endless chat template for 120 s without stopping")
    took = time.monotonic() - start
    _check(done.returncode, done.stdout, done.stderr, "did not render a one-line question in 2 s", before,
           world, Path(tiny_model_dir), request.node.callspec.id)
    assert took < 90, took
