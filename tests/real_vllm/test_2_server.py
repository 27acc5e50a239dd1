"""vLLM's OpenAI server (CPU build, started by `memagent model serve-vllm`'s library function) behind
`--backend openai`: ask equal to `--backend transformers` call for call; `memagent eval` with the memagent, lookup and
skim workflows equal record for record; a `memagent serve` job whose model calls go to it, equal to ask's result.
One server for the module (~1 min to start, eager), stopped at its end with everything it started."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest
from vllm_cases import ENGINE_FLAGS, FLAGS, ask, calls, free_port, results, run_memagent

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def vllm_server(real_model_dir, tmp_path_factory, vllm_env):
    from memagent.backends.vllm_server import start_server

    log = tmp_path_factory.mktemp("vllm-server") / "server.log"
    t0 = time.monotonic()
    server = start_server(str(real_model_dir), port=free_port(), kv_cache_gib=float(ENGINE_FLAGS[-1]),
                          enforce_eager=True, dtype="float32", start_timeout=600, log_path=log, env=vllm_env)
    print(f"vLLM server up in {time.monotonic() - t0:.0f} s")
    try:
        yield server
    finally:
        server.close()
        assert server.process.poll() is not None


def openai_flags(server, model):
    return ["--backend", "openai", "--base-url", server.base_url, "--tokenizer", model, "--max-concurrency", 4]


def test_the_served_engine_equals_transformers_call_for_call(vllm_server, real_model_dir, docs_file,
                                                             transformers_run, tmp_path, vllm_env):
    with urllib.request.urlopen(vllm_server.base_url + "/models", timeout=10) as r:
        served = json.load(r)["data"][0]
    assert served["id"] == str(real_model_dir) and served["max_model_len"] == 8192
    want_answers, want_trace = transformers_run
    got_answers, got_trace = ask(real_model_dir, docs_file, tmp_path / "openai",
                                 *openai_flags(vllm_server, real_model_dir), env=vllm_env)
    assert calls(got_trace) == calls(want_trace)
    assert results(got_answers) == results(want_answers)


def _eval(model, docs_file, out, methods, *backend, env):
    """`memagent eval` over the documents: each record as the fields that must not depend on the backend."""
    run_memagent("eval", "--model", model, "--data", docs_file, "--methods", methods, *FLAGS, "--no-progress",
                 "--out", out, *backend, env=env)
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    planned = 3 * len(methods.split(","))
    assert summary["records"]["planned"] == summary["records"]["finished"] == planned
    assert summary["records"]["failed"] == 0
    keep = ("sample_id", "method", "status", "prediction", "raw", "score", "tokens")
    return sorted(({k: r.get(k) for k in keep} for r in records), key=lambda r: (r["sample_id"], r["method"]))


def test_eval_memagent_lookup_and_skim_on_the_served_engine(vllm_server, real_model_dir, docs_file,
                                                            transformers_run, tmp_path, vllm_env):
    """memagent's records equal ask's over transformers (the same calls: its trace is compared above); lookup's
    and skim's equal `memagent eval --backend transformers`'s: prediction, raw reply, score, token counts."""
    got = _eval(real_model_dir, docs_file, tmp_path / "vllm", "memagent,lookup,skim",
                *openai_flags(vllm_server, real_model_dir), env=vllm_env)
    assert {r["method"] for r in got} == {"memagent", "lookup", "skim"} and all(r["status"] == "ok" for r in got)
    assert all(r["tokens"]["calls"] >= 2 for r in got)
    want_ask = {a["id"]: a for a in transformers_run[0]}
    memagent = [r for r in got if r["method"] == "memagent"]
    assert [(r["prediction"], r["raw"], r["tokens"]["calls"]) for r in memagent] == \
        [(want_ask[r["sample_id"]]["answer"], want_ask[r["sample_id"]]["raw_answer"], 3) for r in memagent]
    want = _eval(real_model_dir, docs_file, tmp_path / "hf", "lookup,skim", "--backend", "transformers",
                 "--dtype", "float32", "--device", "cpu", env=vllm_env)
    assert [r for r in got if r["method"] != "memagent"] == want


def test_a_serve_job_on_the_served_engine(vllm_server, real_model_dir, docs_file, transformers_run, tmp_path,
                                          vllm_env):
    """`memagent serve --backend openai` in front of the vLLM server: a job over the first document gives the
    memory and answer `ask --backend transformers` gave."""
    import httpx

    row = json.loads(docs_file.read_text().splitlines()[0])
    want = next(a for a in transformers_run[0] if a["id"] == row["id"])
    port = free_port()
    cmd = [sys.executable, "-m", "memagent.cli", "serve", "--model", str(real_model_dir), "--port", str(port),
           "--state-dir", str(tmp_path / "state"), *map(str, openai_flags(vllm_server, real_model_dir)), *FLAGS]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "serve.log", "wb"), env=vllm_env,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            try:
                if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        job = httpx.post(url + "/v1/jobs", json={"document": row["context"], "questions": [row["question"]]},
                         timeout=30).json()
        for _ in range(600):
            view = httpx.get(f"{url}/v1/jobs/{job['id']}", timeout=10).json()
            if view["state"] not in ("queued", "running"):
                break
            time.sleep(0.5)
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=60)
    assert view["state"] == "done", (view, (tmp_path / "serve.log").read_text()[-2000:])
    q = view["questions"][0]
    assert q["chunks_done"] == q["chunks_total"] == 2
    assert (q["answer"], q["raw_answer"], q["memory"]) == (want["answer"], want["raw_answer"], want["memory"])
