"""merge-lora finds an adapter's base model where the adapter folder says, not in the working directory
(issue 24, class 16): a relative base_model_name_or_path is resolved against the adapter folder; one that
exists only from the working directory (where it may be another model) is refused; a run's adapters name
their local base by its absolute path."""
import json

import pytest
import torch

from rl_helpers import tiny_model
from test_lora import perturbed_lora

from memagent.config import ConfigError
from memagent.rl.lora import base_of, merge_lora

pytest.importorskip("peft")
IDS = torch.tensor([[3, 14, 15, 9, 26, 5, 35]])


def _name_base(adapters, name):
    cfg = adapters / "adapter_config.json"
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "base_model_name_or_path": name}))


@pytest.fixture
def layout(tmp_path, monkeypatch):
    """tmp/run/base (the adapters' base), tmp/run/adapters naming "../base", tmp/base a decoy (other weights)
    that "../base" reaches from the working directory tmp/cwd."""
    from memagent.backends.tiny import build_tokenizer

    tok = build_tokenizer()
    tiny_model(seed=0).save_pretrained(tmp_path / "run" / "base")
    tok.save_pretrained(tmp_path / "run" / "base")
    tiny_model(seed=1).save_pretrained(tmp_path / "base")
    tok.save_pretrained(tmp_path / "base")
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "base")
    perturbed_lora(base).save_pretrained(tmp_path / "run" / "adapters")
    _name_base(tmp_path / "run" / "adapters", "../base")
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    return tmp_path


def test_a_relative_base_is_found_from_the_adapter_folder(layout):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    adapters = layout / "run" / "adapters"
    assert base_of(adapters) == str((layout / "run" / "base").resolve())
    out = merge_lora(adapters, layout / "merged")
    got = AutoModelForCausalLM.from_pretrained(out)(IDS).logits
    want = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(layout / "run" / "base"), adapters)(IDS).logits
    decoy = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(layout / "base"), adapters)(IDS).logits
    assert (want - decoy).abs().max() > 1e-3  # the two bases differ
    assert (got - want).abs().max() < 1e-5


def test_a_base_found_only_from_the_working_directory_is_refused(layout):
    adapters = layout / "run" / "adapters"
    _name_base(adapters, "../base/../base")  # from cwd: tmp/base (the decoy); from the adapters: not there
    (layout / "run" / "base").rename(layout / "run" / "moved")
    with pytest.raises(ConfigError, match=r"a relative path that is not there from .*pass --base"):
        base_of(adapters)
    assert base_of(adapters, str(layout / "run" / "moved")) == str(layout / "run" / "moved")  # --base wins


def test_a_name_that_is_no_folder_is_a_hub_id(layout):
    adapters = layout / "run" / "adapters"
    _name_base(adapters, "Qwen/Qwen2.5-0.5B-Instruct")
    assert base_of(adapters) == "Qwen/Qwen2.5-0.5B-Instruct"


def test_adapters_name_their_local_base_by_its_absolute_path(layout):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained("../run/base")  # relative to the working directory
    perturbed_lora(model).save_pretrained(layout / "saved")
    named = json.loads((layout / "saved" / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert named == str((layout / "run" / "base").resolve())
