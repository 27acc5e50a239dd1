"""Checkpoints: no pickle, exact round trip of optimiser/scheduler/RNG, atomic under a crash."""
import json
import random

import numpy as np
import pytest
import torch

from memagent.rl.checkpoint import full as ck
from memagent.rl.config import OptimConfig
from memagent.rl.distributed import DistInfo
from memagent.rl.recipe import DataStream, make_optimizer

from rl_helpers import tiny_model

INFO = DistInfo()


def trained(seed=0):
    model = tiny_model(seed)
    opt, sched = make_optimizer(model, OptimConfig(lr=1e-2, warmup_steps=3))
    for _ in range(2):
        model(input_ids=torch.tensor([[1, 2, 3]])).logits.sum().backward()
        opt.step(), sched.step(), opt.zero_grad()
    return model, opt, sched


def save(root, step, model, opt, sched, **kw):
    return ck.save_checkpoint(root, step, INFO, model=model, tokenizer=None, optimizer=opt, scheduler=sched,
                              trainer_state={"data_position": 7}, **kw)


def test_round_trip_is_exact_and_pickle_free(tmp_path):
    model, opt, sched = trained()
    torch.manual_seed(5), random.seed(5), np.random.seed(5)
    path = save(tmp_path, 3, model, opt, sched)
    want = (torch.rand(3), random.random(), np.random.rand())
    files = {p.name for p in path.rglob("*") if p.is_file()}
    assert all(f.endswith((".safetensors", ".json")) for f in files), files  # nothing unpickled on load
    model2 = tiny_model(seed=1)
    ck.load_model_weights(model2, path / "model")
    opt2, sched2 = make_optimizer(model2, OptimConfig(lr=1e-2, warmup_steps=3))
    torch.manual_seed(0)
    state = ck.load_checkpoint(path, INFO, model=model2, optimizer=opt2, scheduler=sched2)
    assert state["step"] == 3 and state["data_position"] == 7
    assert torch.rand(3).tolist() == want[0].tolist() and (random.random(), np.random.rand()) == want[1:]
    for (n, p), p2 in zip(model.named_parameters(), model2.parameters()):
        assert torch.equal(p, p2), n
    assert sched2.get_last_lr() == sched.get_last_lr()
    for s1, s2 in zip(opt.state.values(), opt2.state.values()):
        for k in s1:
            assert torch.equal(torch.as_tensor(s1[k]), torch.as_tensor(s2[k])), k
    # one more identical optimiser step on both gives identical weights
    for m, o in ((model, opt), (model2, opt2)):
        m(input_ids=torch.tensor([[4, 5]])).logits.sum().backward()
        o.step()
    for p, p2 in zip(model.parameters(), model2.parameters()):
        assert torch.equal(p, p2)


def test_rng_states_restored(tmp_path):
    model, opt, sched = trained()
    torch.manual_seed(11), random.seed(11), np.random.seed(11)
    path = save(tmp_path, 1, model, opt, sched)
    want = (torch.rand(4).tolist(), random.random(), float(np.random.rand()))
    torch.manual_seed(0), random.seed(0), np.random.seed(0)
    ck.load_checkpoint(path, INFO)
    assert (torch.rand(4).tolist(), random.random(), float(np.random.rand())) == want


def test_crash_while_saving_keeps_previous_checkpoint(tmp_path, monkeypatch):
    model, opt, sched = trained()
    first = save(tmp_path, 1, model, opt, sched)

    def killed(*a, **k):
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(ck.os, "replace", killed)  # dies after writing everything, before the rename
    with pytest.raises(KeyboardInterrupt):
        save(tmp_path, 2, model, opt, sched)
    assert (tmp_path / "step_000002.tmp").is_dir()
    assert ck.latest_checkpoint(tmp_path) == first
    monkeypatch.undo()
    monkeypatch.setattr(type(model), "save_pretrained", killed)  # dies while writing the weights
    with pytest.raises(KeyboardInterrupt):
        save(tmp_path, 2, model, opt, sched)
    assert ck.latest_checkpoint(tmp_path) == first
    assert json.loads((first / "trainer_state.json").read_text())["step"] == 1
    monkeypatch.undo()
    second = save(tmp_path, 2, model, opt, sched, keep_last=1)  # the next save cleans up
    assert ck.list_checkpoints(tmp_path) == [second]
    assert not list(tmp_path.glob("*.tmp"))


def test_incomplete_or_mismatched_checkpoint_is_a_clear_error(tmp_path):
    (tmp_path / "step_000004").mkdir()
    assert ck.latest_checkpoint(tmp_path) is None  # no trainer_state.json: not complete
    with pytest.raises(ck.CheckpointError, match="not a complete checkpoint"):
        ck.load_checkpoint(tmp_path / "step_000004", INFO)
    model, opt, sched = trained()
    path = save(tmp_path, 1, model, opt, sched)
    with pytest.raises(ck.CheckpointError, match="same --nproc-per-node"):
        ck.load_checkpoint(path, DistInfo(rank=0, world_size=2))
    from transformers import AutoModelForCausalLM

    from memagent.backends.tiny import tiny_config

    other = AutoModelForCausalLM.from_config(tiny_config(61, hidden_size=16, num_hidden_layers=1,
                                                         num_attention_heads=2, num_key_value_heads=1))
    with pytest.raises((ck.CheckpointError, RuntimeError)):
        ck.load_model_weights(other, path / "model")


def test_data_stream_resumes_mid_epoch():
    a = DataStream(5, seed=3)
    seq = a.take(12)
    assert sorted(seq[:5]) == list(range(5)) and sorted(seq[5:10]) == list(range(5)) and seq[:5] != seq[5:10]
    b = DataStream(5, seed=3, position=7)
    assert b.take(5) == seq[7:12]
