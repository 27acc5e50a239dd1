"""Teacher-forced forward passes over conversation rows: packing and response log-probs.

A micro-batch of rows (prompt ids, response ids) is packed as
    [pad ... pad | prompt | response | pad ... pad]      (B, P + R)
prompts left padded to P, responses right padded to R, positions counted over real tokens only.
The response tokens then sit at the same columns in every row, and the logits that predict them
are the last R + 1 positions minus the final one, so only those (B, R, V) logits are computed
(`logits_to_keep`).

Under FSDP every rank must run the same number of forward passes (each one all-gathers the
parameters), so `micro_batches` pads a rank's list with empty micro-batches up to the largest
count over ranks; an empty one runs a 1-token dummy forward whose loss is multiplied by 0.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor, nn

from memagent.rl.algos import token_logprobs
from memagent.rl.distributed import DistInfo, all_reduce


@dataclass
class PackedRows:
    input_ids: Tensor  # (B, P + R) int64, left-padded prompts then right-padded responses
    attention_mask: Tensor  # (B, P + R) int64, 1 on real tokens
    position_ids: Tensor  # (B, P + R) int64, 0-based over real tokens
    response_ids: Tensor  # (B, R) int64, pad id 0 beyond each response
    response_mask: Tensor  # (B, R) float32, 1 on real response tokens

    def to(self, device: torch.device) -> "PackedRows":
        return PackedRows(*(t.to(device) for t in (self.input_ids, self.attention_mask, self.position_ids,
                                                     self.response_ids, self.response_mask)))


def pack_rows(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], pad_id: int) -> PackedRows:
    """Pack rows as described in the module docstring. Every prompt needs >= 1 token."""
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every row needs a non-empty prompt (the first response token is predicted from it)")
    b = len(prompts)
    p_max = max(len(p) for p in prompts)
    r_max = max(1, max(len(r) for r in responses))
    ids = torch.full((b, p_max + r_max), pad_id, dtype=torch.long)
    attn = torch.zeros((b, p_max + r_max), dtype=torch.long)
    resp = torch.zeros((b, r_max), dtype=torch.long)
    rmask = torch.zeros((b, r_max), dtype=torch.float32)
    for n, (p, r) in enumerate(zip(prompts, responses)):
        ids[n, p_max - len(p) : p_max] = torch.as_tensor(list(p), dtype=torch.long)
        attn[n, p_max - len(p) : p_max] = 1
        if len(r):
            ids[n, p_max : p_max + len(r)] = torch.as_tensor(list(r), dtype=torch.long)
            attn[n, p_max : p_max + len(r)] = 1
            resp[n, : len(r)] = torch.as_tensor(list(r), dtype=torch.long)
            rmask[n, : len(r)] = 1.0
    pos = (attn.cumsum(-1) - 1).clamp_min(0)
    return PackedRows(ids, attn, pos, resp, rmask)


def response_logits(model: nn.Module, packed: PackedRows) -> Tensor:
    """Logits predicting each response token: (B, R, V)."""
    r = packed.response_ids.shape[1]
    kwargs = dict(input_ids=packed.input_ids, attention_mask=packed.attention_mask,
                  position_ids=packed.position_ids, use_cache=False, logits_to_keep=r + 1)
    while True:
        try:
            logits = model(**kwargs).logits
            break
        except TypeError as e:  # an architecture without one of the optional arguments: drop it
            dropped = next((k for k in ("logits_to_keep", "use_cache", "position_ids") if k in kwargs and k in str(e)), None)
            if dropped is None:
                raise
            del kwargs[dropped]
    return logits[:, -(r + 1) : -1]  # (B, R, V) (all positions were computed when logits_to_keep was dropped)


def micro_batches(n_rows: int, micro_batch_size: int, info: DistInfo) -> list[list[int]]:
    """Row index lists of size <= micro_batch_size, padded with [] to the max count over ranks."""
    chunks = [list(range(i, min(i + micro_batch_size, n_rows))) for i in range(0, n_rows, micro_batch_size)]
    count = int(all_reduce(torch.tensor(len(chunks)), info, "max"))
    return chunks + [[] for _ in range(count - len(chunks))]


def dummy_forward_loss(model: nn.Module, pad_id: int, device: torch.device) -> Tensor:
    """A zero loss that still runs the model (keeps collectives of all ranks in step)."""
    packed = pack_rows([[pad_id]], [[pad_id]], pad_id).to(device)
    return response_logits(model, packed).sum() * 0.0


@torch.no_grad()
def rows_logprobs(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    *,
    pad_id: int,
    micro_batch_size: int,
    info: DistInfo,
    temperature: float = 1.0,
) -> list[Tensor]:
    """Log-prob of every response token under `model`, one (R_n,) float32 CPU tensor per row."""
    device = info.device
    out: list[Tensor] = []
    was_training = model.training
    model.eval()
    try:
        for idx in micro_batches(len(prompts), micro_batch_size, info):
            if not idx:
                dummy_forward_loss(model, pad_id, device)
                continue
            packed = pack_rows([prompts[i] for i in idx], [responses[i] for i in idx], pad_id).to(device)
            lp = token_logprobs(response_logits(model, packed), packed.response_ids, temperature)  # (B, R)
            for row, i in enumerate(idx):
                out.append(lp[row, : len(responses[i])].cpu())
    finally:
        model.train(was_training)
    return out


def pad_ragged(rows: Sequence[Tensor], width: int, value: float = 0.0) -> Tensor:
    """Stack 1-D tensors of differing lengths into (B, width), padding on the right."""
    dtype = rows[0].dtype if len(rows) else torch.float32
    out = torch.full((len(rows), width), value, dtype=dtype)
    for n, r in enumerate(rows):
        out[n, : r.numel()] = r
    return out
