"""Varlen attention (memagent.rl.varlen): per-row sdpa for packed micro-batches, sdpa itself otherwise."""
import pytest
import torch

from memagent.config import ConfigError
from memagent.rl.config import ModelOptions
from memagent.rl.distributed import DistInfo
from memagent.rl.model_options import load_kwargs, prepare_model
from memagent.rl.packing import flat_response_logits, pack_flat, pack_rows, response_logits, rows_logprobs
from memagent.rl.varlen import NAME, is_varlen, row_bounds, use_varlen

from rl_helpers import synthetic_minibatch, tiny_model

INFO = DistInfo()


def test_row_bounds_from_position_restarts_or_cumulative_lengths():
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])  # rows of 3, 2 and 4 tokens
    assert row_bounds(pos, None, 9) == [0, 3, 5, 9]
    assert row_bounds(None, torch.tensor([0, 3, 5, 9], dtype=torch.int32), 9) == [0, 3, 5, 9]
    assert row_bounds(None, None, 9) == [0, 9]
    assert row_bounds(torch.tensor([[0, 0, 0]]), None, 3) == [0, 1, 2, 3]  # three one-token rows


def test_packed_forward_equals_the_block_diagonal_mask_and_each_row_alone():
    mb = synthetic_minibatch(seed=2, n_samples=3)
    flat = pack_flat(mb.prompt_ids, mb.response_ids)
    dense = flat_response_logits(tiny_model(), flat)  # transformers' sdpa with its block-diagonal mask
    model = use_varlen(tiny_model())
    assert is_varlen(model) and model.config._attn_implementation == NAME
    varlen = flat_response_logits(model, flat)
    assert varlen.shape == dense.shape and (varlen - dense).abs().max().item() <= 1e-12
    for n in (0, len(mb.prompt_ids) - 1):  # a row alone gives its logits inside the pack
        alone = flat_response_logits(model, pack_flat(mb.prompt_ids[n : n + 1], mb.response_ids[n : n + 1]))[0]
        r = len(mb.response_ids[n])
        assert (alone[:r] - varlen[n, :r]).abs().max().item() <= 1e-12
    # without the row boundaries (one causal sequence) the logits differ: the split is doing the work
    whole = model(input_ids=flat.input_ids).logits[0, flat.keep]
    assert (whole - varlen.reshape(-1, varlen.shape[-1])[flat.slots]).abs().max().item() > 1e-3


def test_padded_forward_and_generation_are_exactly_sdpa():
    mb = synthetic_minibatch(seed=4, n_samples=3)
    rows = pack_rows(mb.prompt_ids, mb.response_ids, pad_id=0)
    sdpa, varlen = tiny_model(), use_varlen(tiny_model())
    assert torch.equal(response_logits(sdpa, rows), response_logits(varlen, rows))  # padding mask: delegated
    one = pack_rows(mb.prompt_ids[:1], mb.response_ids[:1], pad_id=0)  # one row, no padding: causal sdpa
    assert torch.equal(response_logits(sdpa, one), response_logits(varlen, one))
    ids = torch.tensor([[0, 0, 5, 6, 7], [3, 4, 5, 6, 7]])
    mask = (ids != 0).long()
    kw = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(sdpa.generate(ids, **kw), varlen.generate(ids, **kw))  # KV cache, padding, decode steps


def test_packed_logprobs_and_gradients_match_padded_sdpa():
    from memagent.rl.objectives import Term, accumulate_gradients
    from rl_helpers import dapo

    mb = synthetic_minibatch(seed=1, n_samples=4)
    padded, packed = tiny_model(), use_varlen(tiny_model())
    lp_a = rows_logprobs(padded, mb.prompt_ids, mb.response_ids, pad_id=0, micro_batch_size=3, info=INFO)
    lp_b = rows_logprobs(packed, mb.prompt_ids, mb.response_ids, pad_id=0, micro_batch_size=3, info=INFO,
                         micro_batch_tokens=40)
    assert max((a - b).abs().max().item() for a, b in zip(lp_a, lp_b)) <= 1e-10
    grads = []
    for model, tokens in ((padded, 0), (packed, 40)):
        accumulate_gradients(model, [Term(dapo("seq-mean-token-mean", kl_coef=0.1, horizon=8), 1.0, mb)],
                             micro_batch_size=3, pad_id=0, info=INFO, micro_batch_tokens=tokens)
        grads.append({n: p.grad for n, p in model.named_parameters()})
    assert max((grads[0][k] - grads[1][k]).abs().max().item() for k in grads[0]) <= 1e-10


def test_prepare_model_switches_to_varlen_under_packing_only():
    assert not is_varlen(prepare_model(tiny_model(), ModelOptions()))  # padded: sdpa stays
    assert is_varlen(prepare_model(tiny_model(), ModelOptions(), packed=True))  # auto + packing
    assert is_varlen(prepare_model(tiny_model(), ModelOptions(attn_implementation="varlen")))
    assert not is_varlen(prepare_model(tiny_model(), ModelOptions(attn_implementation="sdpa"), packed=True))
    assert load_kwargs(ModelOptions(attn_implementation="varlen"), torch.device("cpu")) == {}
    with pytest.raises(ConfigError, match="unknown"):
        ModelOptions(attn_implementation="flash")


def test_the_exported_model_does_not_name_varlen(tmp_path):
    """A model trained with varlen attention saves a config any transformers install loads."""
    use_varlen(tiny_model()).save_pretrained(tmp_path)
    assert NAME not in (tmp_path / "config.json").read_text()
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(tmp_path).config._attn_implementation != NAME


def test_sliding_window_models_are_refused():
    model = tiny_model()
    model.config.use_sliding_window = True
    with pytest.raises(ConfigError, match="sliding-window"):
        use_varlen(model)
