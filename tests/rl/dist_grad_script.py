"""Run under `torchrun --nproc-per-node 2`: the mini-batch gradient with DDP and with FSDP2.

Each rank trains on its half of the samples (samples whole, as the trainer shards); rank 0 writes
the full gradients to <out>/grads_<agg>_<strategy>.safetensors for the test to compare with one process.
Then the trainer's auxiliary supervised loss on top of a token-mean policy gradient, in one accumulation
over two objectives, each rank taking every second row as the RL trainer's auxiliary term does:
<out>/grads_aux_<strategy>.safetensors.
"""
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).parent))
from rl_helpers import accumulate, dapo, subset, synthetic_minibatch, tiny_model  # noqa: E402

from memagent.rl.distributed import init_distributed, shutdown, wrap_model  # noqa: E402


def main(out: Path, aggs: list[str]) -> None:
    info = init_distributed("cpu")
    mb = synthetic_minibatch(seed=1, n_samples=4)
    # rank 0 gets samples {0, 1}, rank 1 {2, 3}: different row and token counts per rank
    mine = subset(mb, [2 * info.rank, 2 * info.rank + 1])
    rows = aux_rows(mb)
    for agg, strategy in [(a, s) for a in [*aggs, "aux"] for s in ("ddp", "fsdp")]:
        objective = dapo("token-mean" if agg == "aux" else agg, kl_coef=0.1, horizon=8)
        model = wrap_model(tiny_model(), strategy, info)
        if agg == "aux":  # one accumulation over [(dapo, 1), (sft, 3)], each rank taking every second sft row
            _, metrics = accumulate(model, mine, objective, 2, info, rows[info.rank :: info.world_size], 3.0)
        else:
            [metrics] = accumulate(model, mine, objective, 2, info)
        grads = {}
        for name, p in model.named_parameters():
            g = p.grad
            g = g.full_tensor() if hasattr(g, "full_tensor") else g
            grads[name.removeprefix("module.")] = g.detach().clone().contiguous()
        if info.rank == 0:
            grads["__loss__"] = torch.tensor(metrics["loss"], dtype=torch.float64)
            save_file(grads, str(out / f"grads_{agg}_{strategy}.safetensors"))
    shutdown(info)


def aux_rows(mb):
    """The auxiliary loss's rows: the mini-batch's conversations as supervised (prompt, response) pairs."""
    return list(zip(mb.prompt_ids, mb.response_ids))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
