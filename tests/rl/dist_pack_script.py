"""Run under `torchrun --nproc-per-node 2`: the packed mini-batch gradient with FSDP2.

Each rank packs its own samples by a small token budget, so the ranks hold different numbers of packs
(the shorter list is padded with dummy forwards); rank 0 writes the full gradients to
<out>/packed_<strategy>.safetensors for the test to compare with one padded process.
"""
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).parent))
from rl_helpers import dapo, subset, synthetic_minibatch, tiny_model  # noqa: E402

from memagent.rl.distributed import init_distributed, shutdown, wrap_model  # noqa: E402
from memagent.rl.objectives import Term, accumulate_gradients  # noqa: E402
from memagent.rl.packing import token_micro_batches  # noqa: E402


def main(out: Path) -> None:
    info = init_distributed("cpu")
    mb = synthetic_minibatch(seed=1, n_samples=4)
    mine = subset(mb, [info.rank]) if info.rank == 0 else subset(mb, [1, 2, 3])  # 1 sample against 3
    lengths = [len(p) + len(r) for p, r in zip(mine.prompt_ids, mine.response_ids)]
    own = [c for c in token_micro_batches(lengths, 12, info) if c]
    for strategy in ("fsdp",):  # FSDP2: every forward is a collective
        model = wrap_model(tiny_model(), strategy, info)
        [metrics] = accumulate_gradients(model, [Term(dapo("seq-mean-token-mean"), 1.0, mine)], micro_batch_size=2,
                                         pad_id=0, info=info, micro_batch_tokens=12)
        grads = {}
        for name, p in model.named_parameters():
            g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            grads[name.removeprefix("module.")] = g.detach().clone().contiguous()
        counts = [torch.zeros((), dtype=torch.int64) for _ in range(info.world_size)]
        torch.distributed.all_gather(counts, torch.tensor(len(own)))
        if info.rank == 0:
            grads["__loss__"] = torch.tensor(metrics["loss"], dtype=torch.float64)
            grads["__packs__"] = torch.stack(counts)
            save_file(grads, str(out / f"packed_{strategy}.safetensors"))
    shutdown(info)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
