"""Run under `torchrun --nproc-per-node 2`: the mini-batch gradient with DDP and with FSDP2.

Each rank trains on its half of the samples (samples whole, as the trainer shards); rank 0 writes
the full gradients to <out>/grads_<agg>_<strategy>.safetensors for the test to compare with one process.
"""
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).parent))
from rl_helpers import subset, synthetic_minibatch, tiny_model  # noqa: E402

from memagent.rl.distributed import init_distributed, shutdown, wrap_model  # noqa: E402
from memagent.rl.update import LossSettings, accumulate_gradients  # noqa: E402


def main(out: Path, aggs: list[str]) -> None:
    info = init_distributed("cpu")
    mb = synthetic_minibatch(seed=1, n_samples=4)
    # rank 0 gets samples {0, 1}, rank 1 {2, 3}: different row and token counts per rank
    mine = subset(mb, [2 * info.rank, 2 * info.rank + 1])
    for agg, strategy in [(a, s) for a in aggs for s in ("ddp", "fsdp")]:
        settings = LossSettings(agg=agg, kl_coef=0.1, horizon=8)
        model = wrap_model(tiny_model(), strategy, info)
        metrics = accumulate_gradients(model, mine, settings, micro_batch_size=2, pad_id=0, info=info)
        grads = {}
        for name, p in model.named_parameters():
            g = p.grad
            g = g.full_tensor() if hasattr(g, "full_tensor") else g
            grads[name.removeprefix("module.")] = g.detach().clone().contiguous()
        if info.rank == 0:
            grads["__loss__"] = torch.tensor(metrics["loss"], dtype=torch.float64)
            save_file(grads, str(out / f"grads_{agg}_{strategy}.safetensors"))
    shutdown(info)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
