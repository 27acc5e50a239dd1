"""Per-GPU memory and steps per epoch of a training config, without a GPU and without loading weights
(`memagent train --dry-run CONFIG`).

Everything is arithmetic on the model's shape (its config.json, or `KNOWN_SHAPES` for a Hugging Face id) and the
TrainConfig. Per GPU, for P parameters of b bytes (bf16: 2; `dtype=auto` assumes a GPU with bf16) over N GPUs:

    weights      P b / N             (FSDP2 shards; DDP and one process keep P b)
    gradients    P b / N             (same dtype as the parameters)
    optimizer    2 P b / N           AdamW's two moments, in the parameters' dtype (torch.optim.AdamW)
    reference    P b / N             the frozen KL reference (loss.kl_coef > 0), sharded like the policy
    rollout copy P b                 rollout.engine=policy under FSDP2: an unsharded copy generates (rl/rollout.py)
    gathered     (3 layers + root) b FSDP2's all-gathered parameters of the running and prefetched layer, one
                                     layer's unsharded gradients, the embeddings and head when the root runs
    activations  T x per-token bytes saved for the backward pass at T = tokens of one micro-batch:
                   without checkpointing  L (6h + 2 kv + 4 i) b per token (each layer keeps its input, both norms'
                                          outputs, q, the attention output, k and v, and the MLP's gate, up,
                                          activation and product; flash/sdpa attention stores no T x T matrix)
                   with checkpointing     L h b per token (each layer's input) + one layer's (6h + 2 kv + 4 i) b
                                          recomputed at a time
    logits       R V (b + 8)         the response positions' logits, their float32 copy and log-softmax (R = response
                                     tokens of the micro-batch)

With LoRA (`lora.r > 0`, peft) only the adapters train. A targeted linear d_in -> d_out gets A (r x d_in) and
B (d_out x r): A_p = L sum_t r (d_in_t + d_out_t) adapter parameters (+ r (h + V) for `lm_head`), float32 (peft
casts adapters of a bf16 model to float32), so a = 4 A_p bytes:

    weights      (P b + a) / N       the frozen base and the adapters
    gradients    a / N               the adapters only (the base has none)
    optimizer    2 a / N             AdamW's moments of the adapters only
    reference    0                   the base with the adapters disabled (no copy)
    gathered     (2 layers + root) b + 3 layers' adapters x 4   (no unsharded base gradients)
    activations  + L x sum_t (d_in_t + r) x 4 per token: each adapter's float32 copy of its input and its
                 r-wide output, saved for the adapters' backward (with checkpointing: one layer's)

`model.cpu_offload` moves weights, gradients, optimizer (and the reference) to host memory, reported apart.
Not counted: the CUDA context and allocator fragmentation (~1-3 GB), vLLM's own share (`rollout.engine=vllm`:
its `gpu_memory_utilization`), the rollout's KV cache (generation does not overlap the update).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path

from memagent.config import ConfigError
from memagent.model_shapes import KNOWN_SHAPES, ModelShape, ShapeError, known_shape, read_model_config
from memagent.model_shapes import shape_from_config as base_shape_from_config
from memagent.rl.config import TrainConfig
from memagent.rl.scale_config import LoraConfig

GB = 1e9
TEMPLATE_TOKENS = 200  # prompt template around query, chunk and memory (an allowance, not measured per model)


def shape_from_config(config: dict, where: str) -> ModelShape:
    """A ModelShape from a Hugging Face config.json's fields (memagent.model_shapes); a ConfigError names a
    missing one."""
    try:
        return base_shape_from_config(config, where)
    except ShapeError as e:
        if e.missing is None:
            raise ConfigError(str(e)) from None
        raise ConfigError(f"{where} lacks a usable {e.missing!r} field (need hidden_size, intermediate_size, "
                          "num_hidden_layers, num_attention_heads, vocab_size)") from None


def model_shape(model: str) -> ModelShape:
    """The shape of `model`: a local folder's config.json, else a Hugging Face id of `KNOWN_SHAPES`."""
    if not model:
        raise ConfigError("no model: set model=PATH_OR_HF_ID (the estimate needs its shape)")
    path = Path(model)
    if path.is_dir():
        cfg_file = path / "config.json"
        if not cfg_file.is_file():
            raise ConfigError(f"model folder {path} has no config.json; give a save_pretrained folder")
        return shape_from_config(read_model_config(cfg_file, ConfigError), str(cfg_file))
    shape = known_shape(model)
    if shape is None:
        raise ConfigError(f"model {model!r} is not a local folder and not a known Hugging Face id; known: "
                          f"{', '.join('Qwen/Qwen2.5-' + k.split('-')[1].upper() for k in KNOWN_SHAPES)} (and their "
                          "-Instruct); or download it and pass the folder (only config.json is read)")
    return shape


ADAPTER_BYTES = 4  # peft keeps LoRA adapters in float32 (autocast_adapter_dtype), also on a bf16 model


@dataclass(frozen=True)
class AdapterShape:
    """The LoRA adapters of a ModelShape: parameter counts and what they save for the backward pass."""

    layer_params: int  # adapter parameters of one decoder layer: sum over targets of r (d_in + d_out)
    root_params: int  # adapter parameters outside the layers (lm_head: r (h + V)), else 0
    layer_saved: int  # float32 values one layer's adapters save per token: sum over targets of d_in + r
    layers: int

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.root_params


def linear_dims(shape: ModelShape) -> dict[str, tuple[int, int]]:
    """(d_in, d_out) of each linear layer of a decoder layer (Llama / Qwen2 names)."""
    h, q, kv, i = shape.hidden, shape.heads * shape.d_head, shape.kv, shape.intermediate
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}


def adapter_shape(shape: ModelShape, lora: LoraConfig) -> AdapterShape | None:
    """The adapters `lora` puts on `shape` (None when lora.r is 0); a ConfigError names an unknown target."""
    if lora.r == 0:
        return None
    dims = linear_dims(shape)
    unknown = [t for t in lora.target_modules if t not in dims and t != "lm_head"]
    if unknown:
        raise ConfigError(f"lora.target_modules: the estimate knows no linear layer named {', '.join(unknown)}; "
                          f"known: {', '.join(dims)}, lm_head")
    layer = [dims[t] for t in lora.target_modules if t in dims]
    root = lora.r * (shape.hidden + shape.vocab) if "lm_head" in lora.target_modules else 0
    return AdapterShape(layer_params=sum(lora.r * (d_in + d_out) for d_in, d_out in layer), root_params=root,
                        layer_saved=sum(d_in + lora.r for d_in, _ in layer), layers=shape.layers)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per GPU of one update (see the module docstring); `host` is what model.cpu_offload moves to the CPU."""

    weights: float
    gradients: float
    optimizer: float
    reference: float
    rollout_copy: float
    gathered: float
    activations: float
    logits: float
    host: float = 0.0

    @property
    def total(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self) if f.name != "host")


def activation_bytes(shape: ModelShape, tokens: int, dtype_bytes: int, checkpointing: bool,
                     adapters: AdapterShape | None = None) -> float:
    """Bytes of activations saved for the backward pass of one micro-batch of `tokens` tokens."""
    per_layer = (6 * shape.hidden + 2 * shape.kv + 4 * shape.intermediate) * dtype_bytes  # per token
    per_layer += adapters.layer_saved * ADAPTER_BYTES if adapters else 0
    if checkpointing:
        return tokens * (shape.layers * shape.hidden * dtype_bytes + per_layer)
    return tokens * shape.layers * per_layer


def estimate_memory(shape: ModelShape, *, gpus: int, sharded: bool, dtype_bytes: int, tokens: int,
                    response_tokens: int, checkpointing: bool, reference: bool, rollout_copy: bool,
                    cpu_offload: bool, adapters: AdapterShape | None = None) -> MemoryEstimate:
    """Per-GPU bytes of an update step (module docstring). sharded: FSDP2 over `gpus` (> 1) processes;
    adapters: LoRA (the base frozen, `reference` ignored: the base with adapters disabled is the reference)."""
    p = shape.params * dtype_bytes
    n = gpus if sharded else 1
    if adapters:
        a = adapters.params * ADAPTER_BYTES
        states = {"weights": (p + a) / n, "gradients": a / n, "optimizer": 2 * a / n, "reference": 0.0}
        gathered = ((2 * shape.layer_params + shape.root_params) * dtype_bytes
                    + 3 * adapters.layer_params * ADAPTER_BYTES)
    else:
        states = {"weights": p / n, "gradients": p / n, "optimizer": 2 * p / n, "reference": p / n if reference else 0.0}
        gathered = (3 * shape.layer_params + shape.root_params) * dtype_bytes
    host = 0.0
    if cpu_offload and sharded:
        host, states = sum(states.values()), {k: 0.0 for k in states}
    return MemoryEstimate(**states, rollout_copy=p if rollout_copy else 0.0, gathered=gathered if sharded else 0.0,
                          activations=activation_bytes(shape, tokens, dtype_bytes, checkpointing, adapters),
                          logits=response_tokens * shape.vocab * (dtype_bytes + 8), host=host)


@dataclass(frozen=True)
class UpdateShape:
    """Tokens of one training row and of one micro-batch, from the config."""

    row: int  # prompt + response tokens of a longest row (query + chunk + memory + template, then memory)
    response: int  # response tokens of a longest row
    tokens: int  # tokens of one micro-batch
    responses: int  # response tokens of one micro-batch (the logits computed)
    how: str  # how the micro-batch is formed, in words


def update_shape(cfg: TrainConfig) -> UpdateShape:
    a = cfg.agent
    response = max(a.memory_tokens, a.answer_tokens)
    row = a.query_tokens + a.chunk_tokens + a.memory_tokens + TEMPLATE_TOKENS + response
    if cfg.update.packing:
        t = cfg.update.micro_batch_tokens
        rows = math.ceil(t / row)  # rows are rarely all longest: count the partial one
        return UpdateShape(row, response, max(t, row), rows * response,
                           f"packed: update.micro_batch_tokens={t} (up to {rows} row(s) of <= {row} tokens)")
    m = cfg.update.micro_batch_size
    return UpdateShape(row, response, m * row, m * response,
                       f"padded: update.micro_batch_size={m} rows x {row} tokens (longest row)")


def estimate_for(cfg: TrainConfig, shape: ModelShape, gpus: int, checkpointing: bool) -> MemoryEstimate:
    """The estimate of `cfg` on `gpus` GPUs (launched with torchrun --nproc-per-node gpus)."""
    sharded = cfg.strategy == "fsdp" and gpus > 1
    dtype_bytes = 4 if cfg.dtype == "float32" else 2
    u = update_shape(cfg)
    return estimate_memory(shape, gpus=gpus, sharded=sharded, dtype_bytes=dtype_bytes, tokens=u.tokens,
                           response_tokens=u.responses, checkpointing=checkpointing,
                           reference=cfg.loss.kl_coef > 0, rollout_copy=sharded and cfg.rollout.engine == "policy",
                           cpu_offload=cfg.model_options.cpu_offload, adapters=adapter_shape(shape, cfg.lora))


def count_samples(path: str) -> int:
    """Non-blank lines of a JSONL data file (one sample each); a ConfigError when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return sum(1 for line in f if line.strip())
    except OSError as e:
        raise ConfigError(f"cannot read data file {path}: {e}; pass --samples N instead") from None


def steps_per_epoch(samples: int, batch_size: int) -> float:
    """Training steps to see every sample once: each step draws rollout.batch_size questions."""
    return samples / batch_size


def lora_lines(lora: LoraConfig, shape: ModelShape, engine: str = "policy") -> list[str]:
    """The dry run's lines on LoRA: the adapter count and what is frozen ([] when lora.r is 0); `engine`:
    rollout.engine (a vLLM engine holds the merged weights: the base's size again, on its own memory)."""
    adapters = adapter_shape(shape, lora)
    if adapters is None:
        return []
    merged = [] if engine == "policy" else [f"lora: rollout.engine={engine} gets the merged weights (base + "
                                            "adapters) after every update, under the base model's names"]
    return [*merged, f"lora: r={lora.r} on {', '.join(lora.target_modules)}: {adapters.params / 1e6:.2f}M adapter parameters "
            f"(r x (d_in + d_out) per targeted linear, {adapters.layer_params} per layer x {shape.layers} layers"
            f"{f' + {adapters.root_params} on lm_head' if adapters.root_params else ''}), float32, with gradients "
            "and AdamW states",
            f"lora: the {shape.params / 1e9:.2f}B base weights are frozen (weights only: no gradients, no optimizer "
            "state); the KL reference is the base with the adapters disabled (no copy)"]


def dry_run_report(cfg: TrainConfig, gpus: int, samples: int | None = None) -> str:
    """The text `memagent train --dry-run` prints: the per-GPU estimate with and without checkpointing, steps."""
    if gpus < 1:
        raise ConfigError(f"--gpus must be >= 1, got {gpus}")
    shape = model_shape(cfg.model)
    on = estimate_for(cfg, shape, gpus, True)
    off = estimate_for(cfg, shape, gpus, False)
    u = update_shape(cfg)
    chosen = "on" if cfg.model_options.gradient_checkpointing else "off"
    lines = [f"model {cfg.model}: {shape.params / 1e9:.2f}B parameters ({shape.layers} layers, hidden {shape.hidden}, "
             f"vocab {shape.vocab}); dtype {'float32' if cfg.dtype == 'float32' else 'bfloat16'}; "
             f"{gpus} GPU(s), strategy {cfg.strategy}",
             *lora_lines(cfg.lora, shape, cfg.rollout.engine),
             f"micro-batch: {u.how}; {u.tokens} tokens, {u.responses} response tokens",
             f"{'per GPU (GB)':<16}{'checkpointing off':>18}{'on':>10}"]
    for f in fields(MemoryEstimate):
        if f.name != "host":
            lines.append(f"{f.name:<16}{getattr(off, f.name) / GB:>18.2f}{getattr(on, f.name) / GB:>10.2f}")
    lines.append(f"{'total':<16}{off.total / GB:>18.2f}{on.total / GB:>10.2f}")
    if on.host:
        lines.append(f"host memory per process (model.cpu_offload): {on.host / GB:.2f} GB")
    est = on if chosen == "on" else off
    lines.append(f"estimate: {est.total / GB:.1f} GB per GPU (model.gradient_checkpointing={chosen == 'on'}; "
                 "plus CUDA context and fragmentation, ~1-3 GB)")
    n = samples if samples is not None else (count_samples(cfg.data) if cfg.data else None)
    if n is None:
        lines.append("steps per epoch: unknown (set data=FILE or pass --samples N)")
    else:
        spe = steps_per_epoch(n, cfg.rollout.batch_size)
        lines.append(f"steps per epoch: {n} samples / rollout.batch_size {cfg.rollout.batch_size} = {spe:.2f} "
                     f"({math.ceil(spe * cfg.num_mini_batches * cfg.update.epochs)} optimiser steps); "
                     f"total_steps {cfg.total_steps} = {cfg.total_steps / spe:.2f} epochs")
    return "\n".join(lines)
