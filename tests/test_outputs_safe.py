"""Outputs never destroy inputs: a model or a run is not overwritten without --force, writes are atomic
(a failed run leaves the old file and no temp file), and user-fixable OS errors read as one line."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil

import pytest

from memagent.cli import run
from memagent.io import OutputError, atomic_write, atomic_write_text, check_output_file, os_error_message


def _digest(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def test_train_out_dir_equal_to_the_model_folder_is_refused_and_the_model_still_loads(tmp_path, tiny_model_dir,
                                                                                      capsys):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    before = _digest(model)
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"id": "1", "question": "q", "answers": ["a"], "context": "text"}) + "\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"model: {model}\ndata: {data}\nout_dir: {model}\nprogress: false\n")
    assert run(["train", str(cfg)]) == 2
    assert "out_dir" in capsys.readouterr().err
    assert _digest(model) == before  # on main: config.json overwritten by the run's config
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(model)


def test_tiny_model_refuses_a_folder_with_a_model_unless_forced(tmp_path, tiny_model_dir, tiny_tokenizer,
                                                                monkeypatch, capsys):
    import memagent.backends.tiny as tiny

    monkeypatch.setattr(tiny, "build_tokenizer", lambda *a, **k: tiny_tokenizer)  # the session's, built once
    model = tmp_path / "trained"
    shutil.copytree(tiny_model_dir, model)
    (model / "model.safetensors").write_bytes(b"trained weights stand-in")
    before = _digest(model)
    assert run(["tiny-model", str(model)]) == 2
    assert "already holds a model" in capsys.readouterr().err and _digest(model) == before
    assert run(["tiny-model", str(model), "--force", "--seed", "1"]) == 0
    assert _digest(model)["model.safetensors"] != before["model.safetensors"]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # the staging folder is gone
    fresh = tmp_path / "fresh" / "m"
    assert run(["tiny-model", str(fresh)]) == 0 and (fresh / "config.json").is_file()


def test_resume_with_fewer_total_steps_than_done_is_refused(tmp_path):
    import torch

    from memagent.config import ConfigError
    from memagent.rl.config import load_config
    from memagent.rl.trainer import train
    from memagent.backends.tiny import build_tokenizer, tiny_config

    tok = build_tokenizer(vocab_size=300)

    def model():
        from transformers import AutoModelForCausalLM

        cfg = tiny_config(len(tok), hidden_size=16, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1)
        cfg.eos_token_id, cfg.pad_token_id = tok.eos_token_id, tok.pad_token_id
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(cfg)

    data = [{"id": str(i), "question": "q?", "document": "a b c", "answers": ["1"]} for i in range(2)]

    def cfg(*extra):
        return load_config(None, [f"out_dir={tmp_path / 'run'}", "rollout.batch_size=2", "rollout.group_size=2",
                                  "update.mini_batch_size=2", "agent.chunk_tokens=8", "agent.memory_tokens=1",
                                  "agent.answer_tokens=1", "loss.kl_coef=0", "save_every=0", "progress=false", *extra])

    train(cfg("total_steps=2"), data, lambda p, g: 0.0, model=model(), tokenizer=tok)
    with pytest.raises(ConfigError, match="has done 2 steps, more than total_steps=1"):
        train(cfg("total_steps=1", "resume=true"), data, lambda p, g: 0.0, model=model(), tokenizer=tok)


def test_a_failed_data_run_keeps_the_old_file_and_leaves_no_temp_file(tmp_path, monkeypatch, capsys):
    import memagent.cli.data as data_cli
    from memagent.tasks.schema import DataError

    out = tmp_path / "toy.jsonl"
    out.write_text("the old file\n")

    def failing(*args, **kwargs):
        yield {"id": "0"}
        raise DataError("cannot make sample 1")

    monkeypatch.setattr(data_cli, "iter_samples", failing)  # the command's own name
    assert run(["data", "toy", "--chunks", "2", "--out", str(out)]) == 2
    assert "cannot make sample 1" in capsys.readouterr().err
    assert out.read_text() == "the old file\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["toy.jsonl"]  # on main: toy.jsonl.tmp stays


def test_atomic_write_replaces_on_success_and_keeps_the_old_file_on_failure(tmp_path):
    target = tmp_path / "f.txt"
    target.write_text("old")
    os.chmod(target, 0o640)
    with pytest.raises(RuntimeError):
        with atomic_write(target) as fh:
            fh.write("half")
            raise RuntimeError("disk went away")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["f.txt"]
    atomic_write_text(target, "new\n")
    assert target.read_text() == "new\n" and (target.stat().st_mode & 0o777) == 0o640


def test_output_checks(tmp_path):
    src = tmp_path / "src.json"
    src.write_text("{}")
    os.link(src, tmp_path / "hard.json")
    with pytest.raises(OutputError, match="same path as --source"):
        check_output_file(tmp_path / "hard.json", "--out", {"--source": src})  # a hard link is the same file
    with pytest.raises(OutputError, match="is a folder"):
        check_output_file(tmp_path, "--out")
    with pytest.raises(OutputError, match="src.json is a file, not a folder"):
        check_output_file(src / "a" / "b.jsonl", "--out")
    assert check_output_file(tmp_path / "new" / "deeper" / "o.jsonl", "--out") == tmp_path / "new" / "deeper" / "o.jsonl"
    assert not (tmp_path / "new").exists()  # checked, not created


@pytest.mark.parametrize("code, expected", [
    (errno.ENOSPC, "/x/o.jsonl: no space left on the device"),
    (errno.EFBIG, "/x/o.jsonl: the file is too large"),
    (errno.EACCES, "/x/o.jsonl: permission denied"),
    (errno.EISDIR, "/x/o.jsonl: it is a folder where a file is expected"),
    (errno.ENOTDIR, "/x/o.jsonl: a part of the path is a file"),
    (errno.EROFS, "/x/o.jsonl: the file system is read-only"),
])
def test_os_errors_the_user_can_fix_have_a_message(code, expected):
    assert os_error_message(OSError(code, os.strerror(code), "/x/o.jsonl")).startswith(expected)


def test_an_os_error_raised_with_our_own_message_keeps_it():
    assert os_error_message(FileExistsError("runs/demo already holds a demo run; choose another --out")) == \
        "runs/demo already holds a demo run; choose another --out"


def test_other_os_errors_are_not_dressed_up_as_user_errors():
    assert os_error_message(OSError(errno.EBADF, "Bad file descriptor")) is None


def test_train_out_dir_rules(tmp_path):
    from memagent.config import ConfigError
    from memagent.rl.config import TrainConfig, check_out_dir

    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"x")
    old = tmp_path / "old"
    old.mkdir()
    (old / "metrics.jsonl").write_text('{"step": 1}\n')
    check_out_dir(TrainConfig(out_dir=str(tmp_path / "new")))  # a new folder: fine
    with pytest.raises(ConfigError, match="holds a model"):
        check_out_dir(TrainConfig(out_dir=str(model)))
    check_out_dir(TrainConfig(out_dir=str(model), force=True))  # forced
    with pytest.raises(ConfigError, match="holds an earlier run"):
        check_out_dir(TrainConfig(out_dir=str(old)))
    check_out_dir(TrainConfig(out_dir=str(old), resume=True))  # continuing it
    check_out_dir(TrainConfig(out_dir=str(old), force=True))  # starting over in it
    with pytest.raises(OutputError, match="its config.json"):
        check_out_dir(TrainConfig(out_dir=str(tmp_path), data=str(tmp_path / "config.json")))


def test_a_full_disk_mid_write_is_one_line_and_keeps_the_old_file(tmp_path):
    """A file-size limit (RLIMIT_FSIZE) stands in for a full disk: the write fails with EFBIG part way."""
    import resource
    import subprocess
    import sys

    out = tmp_path / "toy.jsonl"
    out.write_text("old\n")

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.run([sys.executable, "-m", "memagent.cli", "data", "toy", "--chunks", "4", "--samples", "200",
                        "--out", str(out)], env=env, capture_output=True, text=True, timeout=120, preexec_fn=limit)
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("error: ") and f"error: {out}: the file is too large" in p.stderr
    assert "Traceback" not in p.stderr
    assert out.read_text() == "old\n" and sorted(x.name for x in tmp_path.iterdir()) == ["toy.jsonl"]
