"""The CLI end to end, in process: real tiny model, real files, errors as one clear line."""
import json
import math

import pytest


def test_tiny_model_then_ask_with_trace(run_cli, tmp_path, tiny_tokenizer):
    model = tmp_path / "m"
    code, out, _ = run_cli("tiny-model", model, "--seed", 3)
    assert code == 0 and (model / "model.safetensors").exists() and (model / "tokenizer.json").exists()
    doc = tmp_path / "doc.txt"
    doc.write_text(" ".join(f"fact{i} is value{i}." for i in range(400)))
    trace = tmp_path / "trace.jsonl"
    code, out, err = run_cli("ask", "--model", model, "--document", doc, "--question", "What is fact7?",
                             "--chunk-tokens", 300, "--memory-tokens", 12, "--answer-tokens", 12,
                             "--trace", trace, "--no-progress")
    assert code == 0, err
    assert out.strip()  # the answer, or the explicit no-answer line
    n_tokens = len(tiny_tokenizer(doc.read_text(), add_special_tokens=False)["input_ids"])
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    assert len(records) == math.ceil(n_tokens / 300) + 1
    assert all(r["chunk_tokens"] <= 300 and r["memory_tokens"] <= 12 for r in records[:-1])
    assert records[-1]["kind"] == "final" and "raw_answer" in records[-1]


def test_jsonl_input_runs_as_one_batch(run_cli, tmp_path, tiny_model_dir, tiny_tokenizer):
    inp = tmp_path / "in.jsonl"
    (tmp_path / "d.txt").write_text("city river " * 50)
    lines = [{"id": "a", "question": "q1", "context": "memory key " * 30},
             {"id": "b", "question": "q2", "document": "d.txt"}]
    inp.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    outp = tmp_path / "out.jsonl"
    code, _, err = run_cli("ask", "--model", tiny_model_dir, "--input", inp, "--output", outp,
                           "--chunk-tokens", 40, "--memory-tokens", 8, "--answer-tokens", 8, "--no-progress")
    assert code == 0, err
    results = [json.loads(line) for line in outp.read_text().splitlines()]
    assert [r["id"] for r in results] == ["a", "b"]
    # the tiny tokenizer: "memory key " x 30 is 60 word tokens + the last space = 61 tokens, 2 chunks of <= 40;
    # "city river " x 50 is 101 tokens, 3 chunks
    n_tokens = [len(tiny_tokenizer(text, add_special_tokens=False)["input_ids"])
                for text in ("memory key " * 30, "city river " * 50)]
    assert n_tokens == [61, 101]
    assert [r["num_chunks"] for r in results] == [math.ceil(61 / 40), math.ceil(101 / 40)] == [2, 3]
    assert all("answer" in r and "memory" in r for r in results)


@pytest.mark.parametrize(
    "setup, args, message",
    [
        (None, ["--document", "{tmp}/missing.txt", "--question", "q"], "not found"),
        ("binary", ["--document", "{tmp}/bin.dat", "--question", "q"], "not valid UTF-8"),
        ("text", ["--document", "{tmp}/doc.txt", "--question", "why " * 2000], "over its budget"),
        ("text", ["--document", "{tmp}/doc.txt", "--question", "q", "--chunk-tokens", "0"], "--chunk-tokens must be a positive"),
        ("text", ["--document", "{tmp}/doc.txt", "--question", "q", "--chunk-tokens", "20000"], "window"),
        ("text", ["--document", "{tmp}/doc.txt", "--question", "q", "--backend", "nope"], "--backend must be one of transformers, openai, vllm; got 'nope'"),
        ("text", ["--document", "{tmp}/doc.txt"], "give --question"),
        ("badjsonl", ["--input", "{tmp}/in.jsonl"], "in.jsonl:2"),
    ],
)
def test_bad_input_is_one_clear_line(run_cli, tmp_path, tiny_model_dir, setup, args, message):
    if setup == "binary":
        (tmp_path / "bin.dat").write_bytes(bytes(range(256)) * 4)
    elif setup == "text":
        (tmp_path / "doc.txt").write_text("a short document")
    elif setup == "badjsonl":
        (tmp_path / "in.jsonl").write_text('{"question": "q", "context": "x"}\n{not json}\n')
    code, out, err = run_cli("ask", "--model", tiny_model_dir, "--no-progress",
                             *[a.replace("{tmp}", str(tmp_path)) for a in args])
    assert code == 2
    assert message in err and "Traceback" not in err


def test_unknown_model_is_a_clear_error(run_cli, tmp_path):
    (tmp_path / "doc.txt").write_text("text")
    code, _, err = run_cli("ask", "--model", tmp_path / "no-such-model", "--document", tmp_path / "doc.txt",
                           "--question", "q", "--no-progress")
    assert code == 2 and "cannot load model" in err


def test_model_directory_settings_are_defaults_and_flags_override_them(run_cli, tmp_path, tiny_model_dir):
    import shutil

    model = tmp_path / "m"
    shutil.copytree(tiny_model_dir, model)
    (model / "memagent.json").write_text(json.dumps({"chunk_tokens": 50, "memory_tokens": 5, "answer_tokens": 4,
                                                     "memory_template": "Q {question} M {memory} C {chunk} >",
                                                     "final_template": "Q {question} M {memory} >"}))
    doc = tmp_path / "doc.txt"
    doc.write_text("city river " * 100)
    trace = tmp_path / "t.jsonl"
    code, _, err = run_cli("ask", "--model", model, "--document", doc, "--question", "q", "--trace", trace, "--no-progress")
    assert code == 0, err
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    assert all(r["chunk_tokens"] <= 50 and r["memory_tokens"] <= 5 for r in records[:-1]) and len(records) > 2
    code, _, err = run_cli("ask", "--model", model, "--document", doc, "--question", "q", "--trace", trace,
                           "--chunk-tokens", 100, "--no-progress")
    assert code == 0, err
    assert max(json.loads(line)["chunk_tokens"] for line in trace.read_text().splitlines()[:-1]) == 100
    (model / "memagent.json").write_text('{"chunk_size": 3}')
    code, _, err = run_cli("ask", "--model", model, "--document", doc, "--question", "q", "--no-progress")
    assert code == 2 and "unknown setting" in err


def test_saved_agent_settings_read_back_as_the_same_config(tmp_path):
    from memagent.config import AgentConfig
    from memagent.protocol.resolve import model_agent_settings, save_agent_settings

    config = AgentConfig(chunk_tokens=9, memory_tokens=2, answer_tokens=3, query_tokens=4,
                         memory_template="M {memory} C {chunk} Q {question} >",
                         final_template="M {memory} Q {question} >", empty_memory="none none")
    save_agent_settings(tmp_path, config)
    assert AgentConfig(**model_agent_settings(str(tmp_path))) == config
    assert model_agent_settings(str(tmp_path / "elsewhere")) == {}
