"""Backends as plug-ins: registered in the process or found through the entry-point group `memagent.backends`, then
built by every command's `--backend NAME` exactly as the built-ins are."""
import json

import pytest
from plugin_dist import write_dist_info

from memagent import backends
from memagent.backends import BackendError, backend_names, get_backend, load_backend, register_backend, \
    unregister_backend
from memagent.backends.options import BackendOptions
from memagent.errors import InputError

ASK = ["--question", "What is fact7?", "--chunk-tokens", 40, "--memory-tokens", 8, "--answer-tokens", 8,
       "--no-progress"]


def test_builtins_come_first_and_unknown_names_list_every_known_one():
    assert backend_names()[:3] == ["transformers", "openai", "vllm"]
    with pytest.raises(BackendError, match=r"unknown backend 'nope'; valid backends: transformers, openai, vllm"):
        load_backend("nope", "m")
    from memagent.flags import check_options

    with pytest.raises(InputError, match=r"--backend must be one of transformers, openai, vllm; got 'nope'"):
        check_options(BackendOptions(name="nope"))


def test_a_registered_backend_answers_ask_as_the_builtin_does(run_cli, tmp_path, tiny_model_dir):
    """`ask --backend mine` builds the registered factory with (model, **the options a plug-in gets)), and its
    answer and memories equal the built-in transformers backend's over the same model (greedy)."""
    from memagent.backends.hf import TransformersBackend

    built = []

    def mine(model, **kwargs):
        built.append((str(model), kwargs))
        return TransformersBackend.from_pretrained(model, device="cpu", dtype="float32")

    doc = tmp_path / "doc.txt"
    doc.write_text(" ".join(f"fact{i} is value{i}." for i in range(60)))
    register_backend("mine", mine)
    try:
        assert "mine" in backend_names() and get_backend("mine") is mine
        outs = {}
        for name in ("mine", "transformers"):
            trace = tmp_path / f"{name}.jsonl"
            code, out, err = run_cli("ask", "--backend", name, "--model", tiny_model_dir, "--document", doc,
                                     "--trace", trace, *ASK)
            assert code == 0, err
            records = [{k: v for k, v in json.loads(line).items() if k != "seconds"}  # wall clock aside
                       for line in trace.read_text().splitlines()]
            outs[name] = (out, records)
        assert built == [(str(tiny_model_dir), {})]
        assert outs["mine"] == outs["transformers"] and len(outs["mine"][1]) > 2
        # options of another backend are refused for a plug-in, as for the built-ins
        for flags, what in ((["--tokenizer", "x"], "--tokenizer is for --backend openai or vllm, not mine"),
                            (["--speculate", "ngram"], "--speculate is for --backend transformers or vllm, not mine"),
                            (["--base-url", "http://127.0.0.1:9/v1"], "--base-url is for --backend openai, not mine")):
            code, _, err = run_cli("ask", "--backend", "mine", "--model", tiny_model_dir, "--document", doc,
                                   *flags, *ASK)
            assert code == 2 and what in err, err
        assert len(built) == 1  # refused before the backend is built
    finally:
        unregister_backend("mine")
    assert "mine" not in backend_names()
    with pytest.raises(ValueError, match="a word"):
        register_backend("has space", mine)


def test_entry_point_of_an_installed_distribution(tmp_path, monkeypatch):
    """A package's `memagent.backends` entry point, found through a .dist-info on sys.path; a broken one is one
    clear error naming it."""
    (tmp_path / "ep_backend.py").write_text(
        "class Echo:\n"
        "    max_window = None\n"
        "    def __init__(self, model, **kwargs):\n"
        "        self.model, self.kwargs = model, kwargs\n"
        "    def tokenizer(self, text, **kwargs):\n"
        "        return {'input_ids': [1] * len(text.split())}\n"
        "    def prompt_length(self, prompt):\n"
        "        return len(prompt.split())\n"
        "    def generate(self, prompts, params):\n"
        "        return []\n"
        "def broken(model, **kwargs):\n"
        "    raise AssertionError('never built')\n")
    (tmp_path / "ep_broken.py").write_text("raise ImportError('a missing dependency')\n")
    write_dist_info(tmp_path, "ep-backend", {"memagent.backends": {"echo": "ep_backend:Echo", "bad": "ep_broken:x"}})
    assert "echo" not in backend_names()
    monkeypatch.syspath_prepend(str(tmp_path))
    backends._REGISTRY.refresh()
    try:
        assert backend_names() == ["transformers", "openai", "vllm", "bad", "echo"]
        b = BackendOptions(name="echo", chat_template_kwargs={"enable_thinking": False}).load("served-model")
        assert type(b.inner).__module__ == "ep_backend"  # behind memagent.backends.guard (a plug-in)
        assert (b.model, b.kwargs) == ("served-model", {"chat_template_kwargs": {"enable_thinking": False}})
        with pytest.raises(BackendError, match=r"backend 'bad' \(entry point memagent.backends, ep_broken:x\) failed as "
                                               r"it was imported: ImportError: "
                                               r"a missing dependency"):
            load_backend("bad", "m")
    finally:
        monkeypatch.undo()
        backends._REGISTRY.refresh()
    assert "echo" not in backend_names()
