"""Shared builders for the rl tests: a tiny float64 Qwen2 and a fixed synthetic mini-batch."""
from __future__ import annotations

import torch


def tiny_model(seed: int = 0, vocab: int = 61, dtype=torch.float64):
    from transformers import AutoModelForCausalLM

    from memagent.backends.tiny import tiny_config

    cfg = tiny_config(vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=256)
    cfg.pad_token_id = 0
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg).to(dtype)


def synthetic_minibatch(seed: int = 0, n_samples: int = 4, vocab: int = 61, kl: bool = True):
    """Samples with 1-4 conversations each, prompts/responses of different lengths, and
    old/ref log-probs that differ from the policy so clipping and KL are both active."""
    from memagent.rl.objectives import MiniBatch

    g = torch.Generator().manual_seed(seed)
    prompts, responses, sample_index = [], [], []
    for s in range(n_samples):
        for _ in range(int(torch.randint(1, 5, (1,), generator=g))):
            prompts.append(torch.randint(1, vocab, (int(torch.randint(2, 9, (1,), generator=g)),), generator=g).tolist())
            responses.append(torch.randint(1, vocab, (int(torch.randint(1, 7, (1,), generator=g)),), generator=g).tolist())
            sample_index.append(s)
    old = [-4.0 + 0.8 * torch.randn(len(r), generator=g, dtype=torch.float64) for r in responses]
    ref = [-4.0 + 0.5 * torch.randn(len(r), generator=g, dtype=torch.float64) for r in responses] if kl else None
    adv = torch.randn(n_samples, generator=g, dtype=torch.float64)
    idx = torch.tensor(sample_index)
    return MiniBatch(prompts, responses, old, ref, adv[idx], idx)


def subset(mb, samples):
    """The rows of `mb` whose sample is in `samples` (sample ids kept)."""
    from memagent.rl.objectives import MiniBatch

    rows = [n for n in range(len(mb.response_ids)) if int(mb.sample_index[n]) in set(samples)]
    t = torch.tensor(rows)
    return MiniBatch([mb.prompt_ids[n] for n in rows], [mb.response_ids[n] for n in rows],
                     [mb.old_logprobs[n] for n in rows],
                     None if mb.ref_logprobs is None else [mb.ref_logprobs[n] for n in rows],
                     mb.advantages[t], mb.sample_index[t])


def dapo(agg="token-mean", kl_coef=0.1, horizon=8):
    """The `dapo` objective with the paper's clip settings (LossConfig's defaults)."""
    from memagent.rl.config import LossConfig
    from memagent.rl.objectives import DAPO

    return DAPO.from_config(LossConfig(agg=agg, kl_coef=kl_coef), horizon=horizon)


def accumulate(model, mb, objective, micro, info, sft_rows=None, sft_weight=0.0):
    """accumulate_gradients over [(objective, 1, mb)] (+ (sft, sft_weight, sft_rows)); the metrics of each term."""
    from memagent.rl.objectives import SFT, MiniBatch, Term, accumulate_gradients

    terms = [Term(objective, 1.0, mb)]
    if sft_rows is not None:
        terms.append(Term(SFT(), sft_weight, MiniBatch.supervised(sft_rows)))
    return accumulate_gradients(model, terms, micro_batch_size=micro, pad_id=0, info=info)


def torchrun(script, *args, timeout=300):
    """Launch tests/rl/<script> (or `-m module` when script starts with "-m ") under
    `torchrun --standalone --nproc-per-node 2` on CPU (gloo).

    The launcher runs in its own process group, killed as a whole on timeout (no orphans).
    """
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).parent
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(here.parents[1] / "src"))
    target = script.split() if script.startswith("-m ") else [str(here / script)]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           *target, *map(str, args)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"torchrun {script} timed out after {timeout}s:\n{err[-3000:]}")
    assert proc.returncode == 0, out[-3000:] + err[-5000:]
    return out, err
