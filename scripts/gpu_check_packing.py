"""GPU checks of padding-free packing, gradient checkpointing and FSDP2 CPU offload on a tiny random model.

Prints one line per path: PASS, FAIL (with the numbers) or SKIP (with the reason); exits 1 when any FAILs.
Meant for scripts/gpu_check.sh (one GPU, well under a minute); on a machine without CUDA every path
runs on the CPU, flash-attention and offload are skipped.

    packed-sdpa        packed vs padded log-probs and gradients, float32, transformers' sdpa attention
    packed-varlen      packed with memagent's per-row varlen attention (rl/varlen.py) vs padded sdpa: log-probs
                       and gradients, float32
    packed-flash-varlen packed vs padded log-probs with attn_implementation=flash_attention_2 (bf16), and a
                       packed row equal to the same row alone (the varlen kernels keep rows apart)
    checkpointing      identical gradients, lower peak GPU memory of the update (torch.cuda.max_memory_allocated)
    fsdp-cpu-offload   one process group of 1 GPU, FSDP2 fully_shard with CPUOffloadPolicy: an update step
                       runs and the parameters live on the CPU
Run: PYTHONPATH=src python scripts/gpu_check_packing.py
"""
from __future__ import annotations

import importlib.util
import os
import sys
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from memagent.rl.config import LossConfig, ModelOptions  # noqa: E402
from memagent.rl.distributed import DistInfo  # noqa: E402
from memagent.rl.model_options import offload_policy, prepare_model  # noqa: E402
from memagent.rl.objectives import DAPO, MiniBatch, Term, accumulate_gradients  # noqa: E402
from memagent.rl.packing import rows_logprobs  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
INFO = DistInfo(device=DEV)
VOCAB = 512


def model(dtype=torch.float32, attn: str = "sdpa", layers: int = 2, hidden: int = 64, seed: int = 0):
    from transformers import AutoModelForCausalLM

    from memagent.backends.tiny import tiny_config

    cfg = tiny_config(VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    cfg.pad_token_id = 0
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation=attn).to(DEV, dtype)


def rows(n: int = 12, seed: int = 0, short: int = 8, long: int = 120) -> MiniBatch:
    g = torch.Generator().manual_seed(seed)
    prompts, responses = [], []
    for _ in range(n):
        length = int(torch.randint(short, long, (1,), generator=g))
        r = max(1, length // 4)
        prompts.append(torch.randint(1, VOCAB, (length - r,), generator=g).tolist())
        responses.append(torch.randint(1, VOCAB, (r,), generator=g).tolist())
    old = [-6.2 + 0.3 * torch.randn(len(r), generator=g) for r in responses]
    return MiniBatch(prompts, responses, old, None, torch.randn(n, generator=g), torch.arange(n))


def grads(m, mb: MiniBatch, tokens: int) -> dict[str, torch.Tensor]:
    m.zero_grad(set_to_none=True)
    accumulate_gradients(m, [Term(DAPO.from_config(LossConfig(kl_coef=0.0)), 1.0, mb)], micro_batch_size=4,
                         pad_id=0, info=INFO, micro_batch_tokens=tokens)
    return {n: p.grad.detach().float().clone() for n, p in m.named_parameters()}


def max_diff(a: dict, b: dict) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


def check_packed_sdpa() -> str:
    m, mb = model(), rows()
    pad = rows_logprobs(m, mb.prompt_ids, mb.response_ids, pad_id=0, micro_batch_size=4, info=INFO)
    flat = rows_logprobs(m, mb.prompt_ids, mb.response_ids, pad_id=0, micro_batch_size=4, info=INFO,
                         micro_batch_tokens=300)
    lp = max((a - b).abs().max().item() for a, b in zip(pad, flat))
    g = max_diff(grads(m, mb, 0), grads(m, mb, 300))
    assert lp < 1e-4 and g < 1e-4, f"log-prob diff {lp:.2e}, gradient diff {g:.2e}"
    return f"log-prob diff {lp:.2e}, gradient diff {g:.2e}"


def check_packed_varlen() -> str:
    from memagent.rl.varlen import use_varlen

    padded, packed, mb = model(), use_varlen(model()), rows()
    kw = dict(pad_id=0, micro_batch_size=4, info=INFO)
    pad = rows_logprobs(padded, mb.prompt_ids, mb.response_ids, **kw)
    flat = rows_logprobs(packed, mb.prompt_ids, mb.response_ids, micro_batch_tokens=300, **kw)
    lp = max((a - b).abs().max().item() for a, b in zip(pad, flat))
    g = max_diff(grads(padded, mb, 0), grads(packed, mb, 300))
    assert lp < 1e-4 and g < 1e-4, f"log-prob diff {lp:.2e}, gradient diff {g:.2e}"
    return f"log-prob diff {lp:.2e}, gradient diff {g:.2e}"


def check_packed_flash() -> str:
    if DEV.type != "cuda" or importlib.util.find_spec("flash_attn") is None:
        raise SkipCheck("needs CUDA and the flash-attn package")
    flash, sdpa, mb = model(torch.bfloat16, "flash_attention_2"), model(torch.bfloat16, "sdpa"), rows()
    kw = dict(pad_id=0, micro_batch_size=4, info=INFO)
    pad = rows_logprobs(sdpa, mb.prompt_ids, mb.response_ids, **kw)
    flat = rows_logprobs(flash, mb.prompt_ids, mb.response_ids, micro_batch_tokens=300, **kw)
    alone = rows_logprobs(flash, mb.prompt_ids[1:2], mb.response_ids[1:2], micro_batch_tokens=300, **kw)
    lp = max((a - b).abs().max().item() for a, b in zip(pad, flat))
    sep = (alone[0] - flat[1]).abs().max().item()
    assert lp < 0.1 and sep < 0.05, f"bf16 log-prob diff vs padded sdpa {lp:.3f}, packed vs alone {sep:.3f}"
    return f"bf16 log-prob diff vs padded sdpa {lp:.3f}, packed row vs alone {sep:.3f}"


def check_checkpointing() -> str:
    mb = rows(n=8, short=400, long=500)
    out, peaks = {}, {}
    for on in (False, True):
        m = prepare_model(model(layers=6, hidden=256), ModelOptions(gradient_checkpointing=on))
        if DEV.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        out[on] = grads(m, mb, 4096)
        peaks[on] = torch.cuda.max_memory_allocated() / 2**20 if DEV.type == "cuda" else float("nan")
        del m
    d = max_diff(out[False], out[True])
    assert d < 1e-5, f"gradient diff {d:.2e}"
    if DEV.type == "cuda":
        assert peaks[True] < peaks[False], f"peak {peaks[True]:.0f} MB with, {peaks[False]:.0f} MB without"
    return f"gradient diff {d:.2e}; peak GPU memory {peaks[False]:.0f} MB -> {peaks[True]:.0f} MB"


def check_offload() -> str:
    if DEV.type != "cuda":
        raise SkipCheck("needs CUDA")
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=0, world_size=1)
    try:
        policy = offload_policy(ModelOptions(cpu_offload=True), "fsdp", "cuda")
        m = model()
        for layer in m.model.layers:
            fully_shard(layer, offload_policy=policy)
        fully_shard(m, offload_policy=policy)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        before = {n: p.detach().full_tensor().clone() for n, p in m.named_parameters()}
        grads(m, rows(), 300)
        opt.step()
        where = {p.device.type for p in m.parameters()}
        moved = max((p.detach().full_tensor() - before[n]).abs().max().item() for n, p in m.named_parameters())
        assert where == {"cpu"} and moved > 0, f"parameters on {where}, largest change {moved:.2e}"
        return f"parameters on {sorted(where)}, an AdamW step moved them (largest change {moved:.2e})"
    finally:
        dist.destroy_process_group()


class SkipCheck(Exception):
    """A path this machine cannot run."""


def main() -> int:
    failed = 0
    for name, fn in [("packed-sdpa", check_packed_sdpa), ("packed-varlen", check_packed_varlen),
                     ("packed-flash-varlen", check_packed_flash),
                     ("checkpointing", check_checkpointing), ("fsdp-cpu-offload", check_offload)]:
        try:
            print(f"PASS {name}: {fn()}", flush=True)
        except SkipCheck as e:
            print(f"SKIP {name}: {e}", flush=True)
        except Exception as e:  # a check's failure is reported, the others still run
            failed += 1
            print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
            traceback.print_exc(limit=3)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
