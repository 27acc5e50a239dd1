"""Training that goes wrong must not report success: `--resume` with other settings or data is refused and
leaves the run's files as they were; a diverging run stops before saving NaN; a checkpoint of other shapes, a
swapped optimizer file and a metrics line with a non-integer step are one error line each. In process
(`memagent.cli.run`), on a tiny model."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from memagent.cli import run


def _digests(root: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """(root, model dir, config yaml, data file, a run of 1 step with its checkpoint step_000001)."""
    from memagent.backends.tiny import build_tiny_model, build_tokenizer

    root = tmp_path_factory.mktemp("guard")
    model = build_tiny_model(root / "tiny", tokenizer=build_tokenizer(vocab_size=1024), hidden_size=32,
                             intermediate_size=64)
    rows = [{"id": f"q{i}", "question": f"what is key {i}?", "context": f"the key {i} is {i * 3}. the sky is blue.",
             "answers": [str(i * 3)]} for i in range(4)]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "other.jsonl").write_text("".join(json.dumps({**r, "answers": ["x"]}) + "\n" for r in rows))
    cfg = root / "cfg.yaml"
    cfg.write_text("total_steps: 1\nsave_every: 1\nprogress: false\nagent:\n  chunk_tokens: 8\n  memory_tokens: 2\n"
                   "  answer_tokens: 2\nrollout:\n  batch_size: 2\n  group_size: 2\nupdate:\n  mini_batch_size: 2\n"
                   "optim:\n  lr: 1.0e-3\n  warmup_steps: 1\nloss:\n  kl_coef: 0\n")
    out = root / "run"
    assert run(argv(root, model, cfg, out)) == 0
    assert (out / "checkpoints" / "step_000001" / "trainer_state.json").is_file()
    return root, model, cfg, out


def argv(root, model, cfg, out, *extra):
    return ["train", str(cfg), f"model={model}", f"data={root / 'train.jsonl'}", f"out_dir={out}", *extra]


def _copy(files, tmp_path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(files[3], out)
    return out


def _refused(capsys, code, *words):
    out, err = capsys.readouterr()
    lines = [line for line in (out + err).splitlines() if line.startswith("error:")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in out + err, (out, err)
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("change, key", [
    ("agent.chunk_tokens=6", "agent.chunk_tokens (8 then, 6 now)"),
    ("optim.lr=2e-3", "optim.lr"),
    ("rollout.group_size=4", "rollout.group_size"),
    ("seed=7", "seed (0 then, 7 now)"),
    ("data={root}/other.jsonl", "the training data"),
])
def test_resume_with_other_settings_or_data_is_refused_and_touches_nothing(files, tmp_path, capsys, change, key):
    root, model, cfg, _ = files
    out = _copy(files, tmp_path)
    before = _digests(out)
    args = argv(root, model, cfg, out, "--resume", "total_steps=2", change.replace("{root}", str(root)))
    _refused(capsys, run(args), "resume:", key, "other settings")
    assert _digests(out) == before  # config.json and profile.yaml not rewritten, no checkpoint added


def test_resume_may_change_total_steps_and_logging(files, tmp_path, capsys):
    root, model, cfg, _ = files
    out = _copy(files, tmp_path)
    code = run(argv(root, model, cfg, out, "--resume", "total_steps=2", "save_every=2", "keep_last=3"))
    assert code == 0, capsys.readouterr()
    assert (out / "checkpoints" / "step_000002").is_dir()


def test_optim_eps_zero_is_refused(files, tmp_path, capsys):
    root, model, cfg, _ = files
    _refused(capsys, run(argv(root, model, cfg, tmp_path / "r", "optim.eps=0")), "optim.eps must be > 0")
    assert not (tmp_path / "r").exists()


def test_nan_weights_stop_the_run_before_they_are_saved(files, tmp_path, capsys):
    """A step that leaves a NaN in the weights (what optim.eps=0 did) stops the run with an error; no
    checkpoint holds the NaN tensor and the command does not say it trained."""
    from memagent.rl.config import load_config
    from memagent.rl.recipe import TrainingDiverged
    from memagent.rl.trainer import train
    from transformers import AutoModelForCausalLM

    from memagent.backends.tokenizer import load_tokenizer

    root, model_dir, _, _ = files
    model = AutoModelForCausalLM.from_pretrained(str(model_dir))

    def poison(step, metrics):
        with torch.no_grad():
            next(model.parameters())[0, 0] = float("nan")

    cfg = load_config(None, [f"out_dir={tmp_path / 'run'}", "total_steps=1", "rollout.batch_size=2",
                             "rollout.group_size=2", "update.mini_batch_size=2", "agent.chunk_tokens=8",
                             "agent.memory_tokens=2", "agent.answer_tokens=2", "loss.kl_coef=0", "progress=false"])
    data = [{"id": "a", "question": "q?", "context": "the key is 3.", "answers": ["3"]}] * 2
    with pytest.raises(TrainingDiverged, match="holds NaN or inf"):
        train(cfg, data, model=model, tokenizer=load_tokenizer(str(model_dir)), callback=poison)
    assert not list((tmp_path / "run").glob("checkpoints/step_*"))


def test_non_finite_gradient_norm_stops_before_the_optimizer_step(files, tmp_path, capsys, monkeypatch):
    import memagent.rl.recipe as recipe

    monkeypatch.setattr(recipe, "clip_grad_norm", lambda model, clip: torch.tensor(float("nan")))
    root, model, cfg, _ = files
    line = _refused(capsys, run(argv(root, model, cfg, tmp_path / "r")), "training diverged at step 1",
                    "gradient norm is nan")
    assert "trained" not in line and not list((tmp_path / "r").glob("checkpoints/step_*"))


def test_a_checkpoint_of_other_shapes_is_one_error(files, tmp_path, capsys, tiny_model_dir):
    root, model, cfg, _ = files
    out = _copy(files, tmp_path)
    ckpt = out / "checkpoints" / "step_000001" / "model"
    shutil.copy(Path(tiny_model_dir) / "model.safetensors", ckpt / "model.safetensors")  # hidden 64, not 32
    _refused(capsys, run(argv(root, model, cfg, out, "--resume", "total_steps=2")), "weights of other shapes")


def test_a_swapped_optimizer_file_is_one_error(files, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    root, model, cfg, _ = files
    out = _copy(files, tmp_path)
    ckpt = out / "checkpoints" / "step_000001"
    tensors = load_file(ckpt / "optimizer.safetensors")
    key = next(k for k in tensors if k.endswith("/exp_avg"))
    tensors[key] = torch.zeros(3, 5)  # another model's moment
    save_file(tensors, ckpt / "optimizer.safetensors")
    _refused(capsys, run(argv(root, model, cfg, out, "--resume", "total_steps=2")), "optimizer files do not fit",
             "has shape (3, 5)")
    shutil.copy(ckpt / "config.json", ckpt / "optimizer.json")  # a JSON file of another kind
    _refused(capsys, run(argv(root, model, cfg, out, "--resume", "total_steps=2")), "optimizer files do not fit")


def test_a_metrics_line_with_a_text_step_is_one_error(files, tmp_path, capsys):
    root, model, cfg, _ = files
    out = _copy(files, tmp_path)
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"step": "abc", "loss": 0.1}\n')
    before = _digests(out)
    _refused(capsys, run(argv(root, model, cfg, out, "--resume", "total_steps=2")), "metrics.jsonl:2",
             "not a metrics record")
    assert _digests(out) == before
