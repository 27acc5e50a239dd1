"""LoRA adapters through peft (the optional extra `lora`: `pip install 'memagent[lora]'`).

With `lora.r > 0` the policy is wrapped by `peft.get_peft_model`: its base weights are frozen and
only the adapters (A: r x d_in, B: d_out x r, B starting at zero) train. The KL reference is the
same model with the adapters disabled (`adapters_disabled`), so no second copy is held. A
checkpoint's `model/` holds the adapters as `save_pretrained` writes them (adapter_config.json,
adapter_model.safetensors) and the tokenizer; `merge_lora` folds them into the base weights and
writes a full save_pretrained model that loads with `AutoModelForCausalLM`.
"""
from __future__ import annotations

import contextlib
import copy
import errno
import json
import logging
from pathlib import Path
from typing import Any, Iterator

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor, nn

from memagent.backends.tokenizer import VOCAB_FILES, load_tokenizer
from memagent.config import ConfigError
from memagent.io import os_error_message, staged_dir
from memagent.rl.distributed import unwrap
from memagent.rl.config import LoraConfig

log = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def _peft() -> Any:
    try:
        import peft  # lazy: peft
    except ImportError:
        raise ConfigError("lora.r > 0 needs peft: pip install 'memagent[lora]' (or pip install peft)") from None
    return peft


def apply_lora(model: nn.Module, cfg: LoraConfig, engine: str = "policy", seed: int | None = None) -> nn.Module:
    """`model` (a plain Hugging Face causal LM) with LoRA adapters on `cfg.target_modules`; only they train.
    engine: the run's rollout.engine (the vLLM engines get the merged weights, `merged_weights`).
    seed: draw the adapters' random A from this seed (the global generators left as they were), so that a run from
    scratch is the same run twice; None draws from the global generator."""
    if engine != "policy" and "lm_head" in cfg.target_modules and getattr(model.config, "tie_word_embeddings", False):
        raise ConfigError(f"lora.target_modules has lm_head, tied to the input embeddings in this model: "
                          f"rollout.engine={engine} loads one tensor for both and would drop the head's adapter; "
                          "leave lm_head out, or use rollout.engine=policy")
    peft = _peft()
    linear = {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    missing = [t for t in cfg.target_modules if t not in linear]
    if missing:
        raise ConfigError(f"lora.target_modules: the model has no linear layer named {', '.join(missing)}; its "
                          f"linear layers are: {', '.join(sorted(linear))}")
    config = peft.LoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                             target_modules=list(cfg.target_modules), bias="none", task_type="CAUSAL_LM")
    name = getattr(model, "name_or_path", None) or ""
    with torch.random.fork_rng(devices=[], enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(seed)
        wrapped = peft.get_peft_model(model, config)
    if name and Path(name).is_dir():  # a local base is named by its absolute path: merge-lora, run from any
        for adapter in wrapped.peft_config.values():  # folder, finds this model (`base_of`)
            adapter.base_model_name_or_path = str(Path(name).resolve())
    return wrapped


def load_adapters(model: nn.Module, adapter_dir: Path) -> None:
    """Load the adapter weights of a save_pretrained adapter directory into peft model `model` (safetensors)."""
    if not is_lora(model):
        raise ConfigError(f"{adapter_dir} holds LoRA adapters but the run has no adapters: set lora.r to "
                              f"the r of that run ({adapter_dir / ADAPTER_CONFIG})")
    try:
        state = load_file(Path(adapter_dir) / ADAPTER_WEIGHTS)
    except (OSError, ValueError, SafetensorError) as e:  # missing, or cut short (a partial copy)
        raise ConfigError(f"cannot read {Path(adapter_dir) / ADAPTER_WEIGHTS}: {e}; copy the adapter again "
                              "(is the file truncated?)") from None
    from peft import set_peft_model_state_dict  # lazy: peft

    result = set_peft_model_state_dict(unwrap(model), state)
    wanted = {n for n, p in unwrap(model).named_parameters() if p.requires_grad}
    loaded_shapes = {n: p.shape for n, p in unwrap(model).named_parameters() if n in wanted}
    if result.unexpected_keys or len(state) != len(loaded_shapes):
        raise ConfigError(f"{adapter_dir} does not match the run's adapters (lora.r, lora.target_modules): "
                              f"{len(state)} saved tensors for {len(loaded_shapes)} adapter weights, unexpected "
                              f"{list(result.unexpected_keys)[:5]}")


def load_initial_adapters(model: nn.Module, cfg: LoraConfig) -> None:
    """With `cfg.init` set: load that adapter folder's weights into peft model `model` (its r, alpha and target
    modules must be `cfg`'s), so training continues it (the warm-up adapter into RL); nothing without it."""
    if not cfg.init:
        return
    folder = Path(cfg.init)
    adapter_dir = folder / "model" if is_adapter_dir(folder / "model") else folder
    if not is_adapter_dir(adapter_dir):
        raise ConfigError(f"lora.init {cfg.init}: no {ADAPTER_CONFIG} there or in its model/; give the adapter "
                          "folder of a LoRA run (e.g. the warm-up's checkpoints/step_N)")
    saved = _json(adapter_dir / ADAPTER_CONFIG)
    theirs = (saved.get("r"), float(saved.get("lora_alpha") or 0), sorted(saved.get("target_modules") or []))
    ours = (cfg.r, float(cfg.alpha), sorted(cfg.target_modules))
    if theirs != ours:
        raise ConfigError(f"lora.init {adapter_dir} has r={theirs[0]}, alpha={theirs[1]:g}, target_modules="
                          f"{','.join(theirs[2])}; set lora.r, lora.alpha and lora.target_modules to those")
    try:
        load_adapters(model, adapter_dir)
    except RuntimeError as e:  # shapes of another base model
        first = (str(e).strip().splitlines() or ["size mismatch"])[0]
        raise ConfigError(f"lora.init {adapter_dir} does not fit this model ({first}); it was trained on another "
                          "base model") from None


def is_lora(model: nn.Module) -> bool:
    """Whether `model` (wrapped for training or not) is a peft model with adapters."""
    inner = unwrap(model)
    return hasattr(inner, "peft_config") and hasattr(inner, "disable_adapter")


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """Within the block, `model` computes as its base (the adapters are bypassed): the KL reference."""
    with unwrap(model).disable_adapter():
        yield


def trainable_state_dict(model: nn.Module) -> dict[str, Any]:
    """The trainable weights (a LoRA run's adapters), whole, on rank 0 (collective under FSDP): what a LoRA
    checkpoint's model/ holds, without gathering the frozen base."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict  # lazy: torch

    options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
    trainable = {n for n, p in unwrap(model).named_parameters() if p.requires_grad}
    return {k: v for k, v in get_model_state_dict(model, options=options).items() if k in trainable}


def empty_twin(model: nn.Module) -> nn.Module:
    """A fresh, unsharded model of the same architecture and parameter names as `model` (a plain Hugging Face
    causal LM, or a peft model: then the same adapters on a fresh base), in the dtype of `model`'s first
    parameter. Its weights are random until a full state dict of `model` is loaded into it."""
    from transformers import AutoModelForCausalLM  # lazy: transformers

    inner = unwrap(model)
    lora = is_lora(inner)
    base = inner.get_base_model() if lora else inner
    twin = AutoModelForCausalLM.from_config(base.config).to(dtype=next(base.parameters()).dtype)
    twin.generation_config = base.generation_config
    if lora:
        twin = _peft().get_peft_model(twin, copy.deepcopy(inner.peft_config[inner.active_adapter]))
    return twin


def merged_weights(model: nn.Module) -> Iterator[tuple[str, Tensor]]:
    """A LoRA policy's weights as its base model names them, adapters folded in, one tensor at a time:
    W + scaling * B @ A for every adapted linear (what `merge_and_unload` would hold, without touching the
    model), the others as they are; the adapter tensors themselves are not yielded. For pushing into an
    engine that loads plain Hugging Face weights (vLLM). Under FSDP2 every tensor is gathered as it is
    reached (a collective: every rank iterates)."""

    def whole(t: Tensor) -> Tensor:
        return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach()

    inner = unwrap(model)
    adapter = inner.active_adapter
    layers = {name: m for name, m in inner.named_modules() if hasattr(m, "base_layer") and hasattr(m, "lora_A")}
    for key, t in inner.state_dict().items():
        if ".lora_" in key:
            continue
        w = whole(t)
        owner, _, leaf = key.rpartition(".base_layer.")
        if leaf == "weight" and owner in layers and adapter in layers[owner].lora_A:
            m = layers[owner]
            a, b = whole(m.lora_A[adapter].weight), whole(m.lora_B[adapter].weight)  # (r, d_in), (d_out, r)
            acc = torch.promote_types(w.dtype, torch.float32)  # float32 at least, float64 kept
            w = (w.to(acc) + m.scaling[adapter] * (b.to(acc) @ a.to(acc))).to(w.dtype)  # (d_out, d_in)
        name = key.removeprefix("base_model.model.").replace(".base_layer.", ".")
        yield name, w


def is_adapter_dir(path: Path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def base_of(adapter_dir: Path, base: str | None = None) -> str:
    """The base model of an adapter directory: `base`, else the one its adapter_config.json names, else
    the `model` of the run's config.json beside the checkpoint.

    A relative path is resolved against the folder of the file that names it (`adapter_dir/../base` for
    adapter_config.json), never against the working directory, where a folder of that name may hold another
    model: one found only there is refused (pass --base). A name that is no local folder is a Hugging Face id."""
    if base:
        return base
    adapter_dir = Path(adapter_dir)
    named = _json(adapter_dir / ADAPTER_CONFIG).get("base_model_name_or_path") or ""
    found = _local_base(named, adapter_dir, adapter_dir / ADAPTER_CONFIG)
    if found:
        return found
    up = adapter_dir.resolve().parents  # step_N/config.json, then the run's own (step_N is under checkpoints/)
    for cfg in [up[i] / "config.json" for i in (0, 2) if i < len(up)]:
        model = _json(cfg).get("model") if cfg.is_file() else None
        if isinstance(model, str) and model:
            return _local_base(model, cfg.parent, cfg) or model
    if isinstance(named, str) and named:
        return named
    raise ConfigError(f"{adapter_dir} does not say which base model its adapters belong to; pass --base MODEL")


def _local_base(name: Any, anchor: Path, where: Path) -> str | None:
    """The existing local folder `name` means, read from the file `where` in folder `anchor`: an absolute path
    as it is, a relative one under `anchor`; None when it is no such folder (a Hugging Face id, or gone)."""
    if not isinstance(name, str) or not name:
        return None
    path = Path(name)
    if path.is_absolute():
        return name if path.exists() else None
    if (anchor / path).exists():
        return str((anchor / path).resolve())
    if path.exists():
        raise ConfigError(f"{where} names the base model {name!r}, a relative path that is not there from "
                          f"{anchor} ({anchor / path} does not exist) but is from the working directory, which may "
                          f"hold another model; pass --base with the base model's path")
    return None


def merge_lora(checkpoint: Path, out_dir: Path, base: str | None = None, dtype: str = "auto") -> Path:
    """Merge the adapters of `checkpoint` (a step_* directory or its model/ folder) into their base model
    and write the result to `out_dir` (save_pretrained, safetensors, with the tokenizer). Returns out_dir."""
    from transformers import AutoModelForCausalLM  # lazy: transformers

    checkpoint = Path(checkpoint)
    adapter_dir = checkpoint / "model" if is_adapter_dir(checkpoint / "model") else checkpoint
    if not is_adapter_dir(adapter_dir):
        raise ConfigError(f"{checkpoint} holds no LoRA adapters (no {ADAPTER_CONFIG} in it or in its model/); "
                          "give a checkpoint of a run with lora.r > 0")
    base_path = base_of(adapter_dir, base)
    try:
        model = AutoModelForCausalLM.from_pretrained(base_path, dtype=dtype)
        if "lm_head" in _json(adapter_dir / ADAPTER_CONFIG).get("target_modules", []):
            _untie_head(model)
        peft_model = _peft().PeftModel.from_pretrained(model, str(adapter_dir))
    except (OSError, ValueError, SafetensorError) as e:  # a truncated or corrupt weights file: SafetensorError
        raise ConfigError(f"cannot load base model {base_path!r} with the adapters of {adapter_dir}: {e}; check that "
                          "neither file is truncated (copy the checkpoint again)") from None
    except RuntimeError as e:  # "size mismatch for ...": adapters of another architecture's shapes
        raise ConfigError(f"the adapters of {adapter_dir} do not fit base model {base_path!r} ({_mismatch(e)}): they "
                          "were trained on another base model; pass --base with theirs") from None
    tokenizer = _tokenizer_of(adapter_dir, base_path)
    check_same_vocabulary(adapter_dir, base_path)
    merged = peft_model.merge_and_unload()
    try:
        with staged_dir(out_dir) as tmp:  # written aside, then renamed: a failed write leaves no partial model
            merged.save_pretrained(tmp, safe_serialization=True)
            if tokenizer is not None:
                tokenizer.save_pretrained(tmp)
    except (OSError, SafetensorError) as e:  # safetensors reports a full disk as its own error ("os error 28")
        full = getattr(e, "errno", None) == errno.ENOSPC or "os error 28" in str(e)
        why = "no space left on the device" if full else (isinstance(e, OSError) and os_error_message(e)) or str(e)
        raise ConfigError(f"cannot write the merged model to {out_dir}: {why}; free some space or choose another "
                          "OUT_DIR (nothing was left there)") from None
    return Path(out_dir)


def _mismatch(e: Exception) -> str:
    """The first `size mismatch for NAME: ...` line of a load error, shortened; else the error's first line."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    hit = next((line for line in lines if line.startswith("size mismatch")), lines[0] if lines else type(e).__name__)
    return hit if len(hit) < 300 else hit[:300] + "..."


def check_same_vocabulary(adapter_dir: Path, base_path: str) -> None:
    """Refuse adapters saved with another tokenizer than the base model's (another base of the same shapes, e.g. a
    fine-tune with added tokens): ids would mean other words. Nothing to compare when either holds none."""
    folders = [Path(adapter_dir), Path(base_path)]
    if not all(any((f / name).is_file() for name in VOCAB_FILES) for f in folders):
        return
    theirs, ours = (load_tokenizer(str(f)).get_vocab() for f in folders)
    if theirs != ours:
        raise ConfigError(f"the adapters of {adapter_dir} were saved with another tokenizer ({len(theirs):,} tokens) "
                          f"than base model {base_path!r} ({len(ours):,}): they belong to another base model; pass "
                          "--base with theirs")


def _tokenizer_of(adapter_dir: Path, base_path: str) -> Any:
    """The tokenizer the merged model is saved with: the checkpoint's, else the base model's; None (logged) when
    neither local folder holds one, as an empty stand-in would encode every document to 0 tokens."""
    for folder in (adapter_dir, Path(base_path)):
        if any((folder / f).is_file() for f in VOCAB_FILES):
            return load_tokenizer(str(folder))
    if not Path(base_path).is_dir():
        return load_tokenizer(base_path)  # a Hugging Face id
    log.warning("neither %s nor %s holds a tokenizer: the merged model is written without one; copy the base "
                "model's tokenizer files into it", adapter_dir, base_path)
    return None


def _untie_head(model: nn.Module) -> None:
    """Give lm_head its own copy of the weight it shares with the input embeddings (tie_word_embeddings), so
    merging an adapter of lm_head changes the output layer only, not the embeddings too."""
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    if head is not None and embed is not None and head.weight is embed.weight:
        head.weight = nn.Parameter(head.weight.detach().clone())
        model.config.tie_word_embeddings = False
        if hasattr(model.config, "get_text_config"):
            model.config.get_text_config().tie_word_embeddings = False


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read {path}: {e}") from None
    return data if isinstance(data, dict) else {}
