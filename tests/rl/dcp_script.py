"""A supervised run through the training recipe with sharded (DCP) checkpoints; run by test_dcp_checkpoint.py
under `torchrun --nproc-per-node 2` or as one process.

argv: out_dir strategy total_steps resume(0/1) [lora_r [async_save(0/1)]]. A float64 tiny model and fixed rows, so a run's
metrics do not depend on the number of processes beyond float64 rounding.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from rl_helpers import tiny_model  # noqa: E402

from memagent.rl.config import OptimConfig  # noqa: E402
from memagent.rl.distributed import init_distributed, shutdown  # noqa: E402
from memagent.rl.recipe import Recipe, RunSpec  # noqa: E402
from memagent.rl.sft import SFTConfig, Supervised  # noqa: E402


class Tok:
    pad_token_id = 0

    def save_pretrained(self, path):  # the model/ export has no tokenizer here
        pass


def rows():
    return [([1 + (3 * i + j) % 50 for j in range(3 + i % 4)], [1 + (7 * i + j) % 50 for j in range(2 + i % 3)])
            for i in range(16)]


def run(out: str, strategy: str, total_steps: int, resume: bool, lora_r: int = 0, async_save: bool = False):
    info = init_distributed("cpu")
    optim = OptimConfig(lr=1e-2, warmup_steps=0, weight_decay=0.0)
    cfg = SFTConfig(out_dir=out, batch_size=4, micro_batch_size=2, strategy=strategy, progress=False, optim=optim)
    model = tiny_model()
    if lora_r:
        from memagent.rl.lora import apply_lora
        from memagent.rl.config import LoraConfig

        model = apply_lora(model, LoraConfig(r=lora_r, target_modules=["q_proj", "v_proj"]))
    spec = RunSpec(out_dir=Path(out), seed=0, total_steps=total_steps, optimizer_steps=total_steps, data_size=16,
                   save_every=1, keep_last=0, resume=resume, save_final=True, strategy=strategy, optim=optim,
                   config={}, state={"seed": 0}, progress=False, checkpoint_format="dcp", async_save=async_save)
    result = Recipe(spec, info, model, Tok()).run(Supervised(cfg, rows()))
    shutdown(info)
    return result


if __name__ == "__main__":
    out, strategy, steps, resume, *r = sys.argv[1:]
    run(out, strategy, int(steps), resume == "1", int(r[0]) if r else 0, len(r) > 1 and r[1] == "1")
