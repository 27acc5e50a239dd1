"""Teacher-forced forward passes over conversation rows: packing and response log-probs.

Two layouts of a micro-batch of rows (prompt ids, response ids), giving the same (B, R, V) response
logits (the objectives see no difference):

padded (`pack_rows`, micro-batches of `micro_batch_size` rows):
    [pad ... pad | prompt | response | pad ... pad]      (B, P + R)
prompts left padded to P, responses right padded to R, positions counted over real tokens only.
The response tokens then sit at the same columns in every row, and the logits that predict them
are the last R + 1 positions minus the final one, so only those (B, R, V) logits are computed
(`logits_to_keep`).

padding-free (`pack_flat`, micro-batches of at most `micro_batch_tokens` tokens):
    [prompt_1 response_1 prompt_2 response_2 ...]        (1, L), L = sum of the rows' lengths
with position ids restarting at 0 on each row and no attention mask. transformers reads the
restarts as separate sequences: a block-diagonal causal mask for eager / sdpa attention, varlen
kernels for flash-attention (`attn_implementation="flash_attention_2"`). Only the K positions that
predict response tokens get logits (`logits_to_keep` as an index tensor); they are scattered into
the (B, R, V) grid of the padded layout (zeros where a row has no token).

Under FSDP every rank must run the same number of forward passes (each one all-gathers the
parameters), so `micro_batches` pads a rank's list with empty micro-batches up to the largest
count over ranks; an empty one runs a 1-token dummy forward whose loss is multiplied by 0.

Per-row ("varlen") attention, the second part of this module:

A packed micro-batch (`pack_flat`) is one sequence of several rows back to back, position ids
restarting at 0 on each row:

    [prompt_1 response_1 | prompt_2 response_2 | ...]     (1, L),  L = l_1 + l_2 + ...

transformers' sdpa and eager paths read the restarts as separate sequences by building a dense (L, L)
block-diagonal mask, so attention still costs L^2 per head (and the masked kernel is slower than the causal
one). flash-attention's varlen kernels compute each row's causal attention only (sum of l_i^2), but exist on
CUDA with the flash-attn package only. This part gives the same per-row computation everywhere: an
attention implementation registered with transformers as `memagent_varlen` (`register()`), which

- for a packed forward (no mask, queries = keys, several rows): runs PyTorch's causal
  `scaled_dot_product_attention` on each row's slice and concatenates (same result as the block-diagonal
  mask, up to float rounding; row boundaries from `cu_seq_lens_q` when the caller passes them, else from
  the position-id restarts);
- for anything else (padding masks, a KV cache, one row): calls transformers' own sdpa function unchanged.

Its mask function skips the dense mask exactly when the forward has no padding mask, no cache offset and
as many queries as keys; it builds sdpa's mask otherwise. Models with sliding-window layers are refused
(`check_model`): a skipped mask would drop their window.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from memagent.config import ConfigError
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


@dataclass
class FlatRows:
    """Rows packed back to back into one sequence (the padding-free layout of the module docstring)."""

    input_ids: Tensor  # (1, L) int64, each row's prompt then response, rows in order
    position_ids: Tensor  # (1, L) int64, 0-based within each row
    keep: Tensor  # (K,) int64, positions whose logits predict a response token (K = all response tokens)
    slots: Tensor  # (K,) int64, each kept logit's place in the (B * R) response grid
    response_ids: Tensor  # (B, R) int64, pad id 0 beyond each response
    response_mask: Tensor  # (B, R) float32, 1 on real response tokens

    def to(self, device: torch.device) -> "FlatRows":
        return FlatRows(*(t.to(device) for t in (self.input_ids, self.position_ids, self.keep, self.slots,
                                                   self.response_ids, self.response_mask)))


def pack_flat(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]]) -> FlatRows:
    """Pack rows without padding (module docstring). Every prompt needs >= 1 token."""
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every row needs a non-empty prompt (the first response token is predicted from it)")
    r_max = max(1, max(len(r) for r in responses))
    ids: list[int] = []
    pos: list[int] = []
    keep: list[int] = []
    slots: list[int] = []
    for n, (p, r) in enumerate(zip(prompts, responses)):
        start = len(ids) + len(p) - 1  # the last prompt token predicts the first response token
        keep.extend(range(start, start + len(r)))
        slots.extend(range(n * r_max, n * r_max + len(r)))
        ids.extend(p)
        ids.extend(r)
        pos.extend(range(len(p) + len(r)))
    resp = torch.zeros((len(prompts), r_max), dtype=torch.long)
    rmask = torch.zeros((len(prompts), r_max), dtype=torch.float32)
    for n, r in enumerate(responses):
        resp[n, : len(r)] = torch.as_tensor(list(r), dtype=torch.long)
        rmask[n, : len(r)] = 1.0
    as_long = lambda xs: torch.as_tensor(xs, dtype=torch.long)  # noqa: E731
    return FlatRows(as_long(ids)[None], as_long(pos)[None], as_long(keep), as_long(slots), resp, rmask)


def flat_response_logits(model: nn.Module, flat: FlatRows) -> Tensor:
    """Logits predicting each response token, scattered into the padded layout's grid: (B, R, V)."""
    b, r = flat.response_ids.shape
    kwargs = dict(input_ids=flat.input_ids, position_ids=flat.position_ids, use_cache=False, logits_to_keep=flat.keep)
    try:
        logits = model(**kwargs).logits[0]  # (K, V)
    except TypeError as e:  # an architecture without logits_to_keep: compute every position, then pick
        if "logits_to_keep" not in str(e):
            raise
        del kwargs["logits_to_keep"]
        logits = model(**kwargs).logits[0, flat.keep]
    grid = logits.new_zeros((b * r, logits.shape[-1])).index_copy(0, flat.slots, logits)
    return grid.view(b, r, -1)


Batch = PackedRows | FlatRows


def pack_batch(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], pad_id: int,
               flat: bool) -> Batch:
    """The padding-free layout when `flat`, else the padded one."""
    return pack_flat(prompts, responses) if flat else pack_rows(prompts, responses, pad_id)


def batch_logits(model: nn.Module, batch: Batch, vocab_limit: int | None = None) -> Tensor:
    """(B, R, V) response logits of either layout. vocab_limit: only the first that many ids (V = vocab_limit),
    those the tokenizer has text for (`memagent.backends.hf.vocab_limit`): generation never samples the
    others (`VocabMask`), so the trained distribution must not hold them either."""
    logits = flat_response_logits(model, batch) if isinstance(batch, FlatRows) else response_logits(model, batch)
    return logits[..., :vocab_limit] if vocab_limit is not None and logits.shape[-1] > vocab_limit else logits


def micro_batches(n_rows: int, micro_batch_size: int, info: DistInfo) -> list[list[int]]:
    """Row index lists of size <= micro_batch_size, padded with [] to the max count over ranks."""
    chunks = [list(range(i, min(i + micro_batch_size, n_rows))) for i in range(0, n_rows, micro_batch_size)]
    return _pad_count(chunks, info)


def token_micro_batches(lengths: Sequence[int], micro_batch_tokens: int, info: DistInfo) -> list[list[int]]:
    """Row index lists in order, each holding rows of <= micro_batch_tokens tokens in all (a longer row
    alone), padded with [] to the max count over ranks. lengths: prompt + response tokens per row."""
    chunks: list[list[int]] = []
    used = 0
    for i, n in enumerate(lengths):
        if not chunks or used + n > micro_batch_tokens:
            chunks.append([])
            used = 0
        chunks[-1].append(i)
        used += n
    return _pad_count(chunks, info)


def plan_micro_batches(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], *,
                       micro_batch_size: int, micro_batch_tokens: int, info: DistInfo) -> list[list[int]]:
    """By token budget when micro_batch_tokens > 0 (padding-free packing), else by row count."""
    if micro_batch_tokens > 0:
        return token_micro_batches([len(p) + len(r) for p, r in zip(prompts, responses)], micro_batch_tokens, info)
    return micro_batches(len(prompts), micro_batch_size, info)


def _pad_count(chunks: list[list[int]], info: DistInfo) -> list[list[int]]:
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
    micro_batch_tokens: int = 0,
    vocab_limit: int | None = None,
) -> list[Tensor]:
    """Log-prob of every response token under `model`, one (R_n,) CPU tensor per row (the model's
    float dtype, float32 at least). micro_batch_tokens > 0: padding-free micro-batches of that many tokens.
    vocab_limit: the softmax over the first that many ids only (`batch_logits`)."""
    device = info.device
    out: list[Tensor] = []
    was_training = model.training
    model.eval()
    try:
        for idx in plan_micro_batches(prompts, responses, micro_batch_size=micro_batch_size,
                                      micro_batch_tokens=micro_batch_tokens, info=info):
            if not idx:
                dummy_forward_loss(model, pad_id, device)
                continue
            packed = pack_batch([prompts[i] for i in idx], [responses[i] for i in idx], pad_id,
                                micro_batch_tokens > 0).to(device)
            lp = token_logprobs(batch_logits(model, packed, vocab_limit), packed.response_ids, temperature)  # (B, R)
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


# -- per-row ("varlen") attention for padding-free packing without flash-attention ------------------------------

NAME = "memagent_varlen"


def row_bounds(position_ids: Tensor | None, cu_seq_lens: Tensor | None, length: int) -> list[int]:
    """Start offsets of the rows of one packed sequence plus its end: [0, s_1, ..., length].

    cu_seq_lens: (n + 1,) cumulative row lengths when given (the flash-attention convention); else a row starts
    wherever position_ids (1, L) restarts at 0 (or does not step by 1). Neither: one row."""
    if cu_seq_lens is not None:
        return [int(x) for x in cu_seq_lens.tolist()]
    if position_ids is None:
        return [0, length]
    pos = position_ids[0]
    starts = torch.nonzero(pos[1:] != pos[:-1] + 1).flatten() + 1
    return [0, *starts.tolist(), length]


def _repeat_kv(x: Tensor, groups: int) -> Tensor:
    """(B, H_kv, L, D) -> (B, H_kv * groups, L, D), each key/value head repeated for its query heads."""
    if groups == 1:
        return x
    b, h, n, d = x.shape
    return x[:, :, None].expand(b, h, groups, n, d).reshape(b, h * groups, n, d)


def varlen_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                     dropout: float = 0.0, scaling: float | None = None, **kwargs: Any) -> tuple[Tensor, None]:
    """transformers' attention-function signature: query (B, H, L, D), key/value (B, H_kv, L_k, D) ->
    ((B, L, H, D), None). Per-row causal attention for a packed forward; transformers' sdpa otherwise."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward  # lazy: transformers

    if kwargs.get("sliding_window") is not None:
        raise ConfigError("model.attn_implementation=varlen does not support sliding-window attention")
    b, _, n, _ = query.shape
    packed = attention_mask is None and b == 1 and n == key.shape[2] and n > 1
    bounds = row_bounds(kwargs.get("position_ids"), kwargs.get("cu_seq_lens_q"), n) if packed else []
    if len(bounds) <= 2:  # not packed, or a single row: exactly what sdpa would do
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    groups = query.shape[1] // key.shape[1]
    key, value = _repeat_kv(key, groups), _repeat_kv(value, groups)
    p = dropout if module.training else 0.0
    rows = [F.scaled_dot_product_attention(query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], dropout_p=p,
                                           is_causal=True, scale=scaling)
            for s, e in zip(bounds[:-1], bounds[1:])]  # each (1, H, l_i, D)
    return torch.cat(rows, dim=2).transpose(1, 2).contiguous(), None


def varlen_mask(*args: Any, **kwargs: Any) -> Tensor | None:
    """transformers' mask-function signature: no mask for a forward that has no padding mask, no cache offset
    and as many queries as keys (varlen_attention then splits the rows itself); sdpa's mask otherwise."""
    from transformers.masking_utils import sdpa_mask  # lazy: transformers

    names = ("batch_size", "q_length", "kv_length", "q_offset", "kv_offset", "mask_function", "attention_mask")
    given = {**dict(zip(names, args)), **kwargs}
    plain = (given.get("attention_mask") is None and given.get("q_offset", 0) == 0 and given.get("kv_offset", 0) == 0
             and given.get("q_length") == given.get("kv_length"))
    return None if plain else sdpa_mask(*args, **kwargs)


def register() -> str:
    """Register the attention and mask functions with transformers (idempotent); returns their name."""
    from transformers import AttentionInterface  # lazy: transformers
    from transformers.masking_utils import AttentionMaskInterface  # lazy: transformers

    AttentionInterface.register(NAME, varlen_attention)
    AttentionMaskInterface.register(NAME, varlen_mask)
    return NAME


def check_model(model: nn.Module) -> None:
    """Refuse models varlen attention would compute wrongly: sliding-window layers, non-causal attention."""
    config = getattr(model, "config", None)
    if config is None:
        raise ConfigError(f"model.attn_implementation=varlen needs a transformers model, got {type(model).__name__}")
    layer_types = getattr(config, "layer_types", None) or []
    sliding = getattr(config, "use_sliding_window", False) or any(t != "full_attention" for t in layer_types)
    if sliding or not getattr(config, "is_causal", True):
        raise ConfigError("model.attn_implementation=varlen supports causal full-attention models only; this model has "
                          "sliding-window or non-causal layers: use sdpa or flash_attention_2")


def use_varlen(model: nn.Module) -> nn.Module:
    """Switch a loaded transformers model to varlen attention (in place); returns the model."""
    check_model(model)
    name = register()
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
    else:
        model.config._attn_implementation = name
    return model


def is_varlen(model: nn.Module) -> bool:
    """Whether the model computes attention with this module (so packed forwards may pass row bounds)."""
    return getattr(getattr(model, "config", None), "_attn_implementation", None) == NAME
