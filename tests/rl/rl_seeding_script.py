"""A Multi-Conv DAPO run on a float64 tiny model with sharded (DCP) checkpoints; run by
test_rollout_seeding_resume.py under `torchrun --nproc-per-node 2` or as one process.

argv: out_dir total_steps resume(0/1) seeding(rank/sample) [strategy(ddp/fsdp)]. The reward varies between a question's rollouts
(the parity of the final reply's length), so advantages are non-zero and every step trains. Every step also
validates on 6 held-out questions (val.every=1): greedy and sampled accuracy, the latter seeded per question.
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))


def parity_reward(prediction, golds):
    return float(len(prediction or "") % 2)


def policy():
    """The tiny tokenizer and a float64 model built from a fixed seed (the same on every rank)."""
    from transformers import AutoModelForCausalLM

    from memagent.backends.tiny import build_tokenizer, tiny_config

    tok = build_tokenizer(vocab_size=1024)
    cfg = tiny_config(len(tok), hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1)
    cfg.eos_token_id, cfg.pad_token_id = tok.eos_token_id, tok.pad_token_id
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).to(torch.float64)
    model.generation_config.eos_token_id = [tok.eos_token_id, tok.pad_token_id]
    model.generation_config.pad_token_id = tok.pad_token_id
    return model, tok


def samples():
    return [{"id": str(i), "question": f"what is the value of key {i}?",
             "document": f"the key {i} has the value {i * 7}. the river is blue and the city is old.",
             "answers": [str(i * 7)]} for i in range(12)]


def val_file(out: str) -> Path:
    """Held-out questions for val.every (the training samples' format), written atomically beside out_dir:
    every rank writes the same bytes, and a reader never sees a half-written file."""
    import json
    import os

    path = Path(out).parent / "val.jsonl"
    rows = [{"id": f"v{i}", "question": f"what is the value of key {i}?",
             "context": f"the key {i} has the value {i * 5}. the lake is green.", "answers": [str(i * 5)]}
            for i in range(6)]
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(tmp, path)
    return path


def run(out: str, total_steps: int, resume: bool, seeding: str, strategy: str = "ddp"):
    from memagent.rl.config import load_config
    from memagent.rl.trainer import train

    cfg = load_config(None, [f"val.data={val_file(out)}", "val.every=1",
        f"out_dir={out}", f"total_steps={total_steps}", f"resume={str(resume).lower()}", f"rollout.seeding={seeding}",
        "rollout.batch_size=4", "rollout.group_size=4", "update.mini_batch_size=2", "update.micro_batch_size=8",
        "agent.chunk_tokens=12", "agent.memory_tokens=4", "agent.answer_tokens=3", "loss.kl_coef=0.01",
        "optim.lr=5e-3", "optim.warmup_steps=0", "save_every=1", "keep_last=0", "progress=false", "checkpoint.format=dcp",
        f"strategy={strategy}", "device=cpu"])
    model, tok = policy()
    return train(cfg, samples(), parity_reward, model=model, tokenizer=tok)


if __name__ == "__main__":
    out, steps, resume, seeding, *strategy = sys.argv[1:]
    run(out, int(steps), resume == "1", seeding, *strategy)
