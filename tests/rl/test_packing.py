"""Padding-free packing: the same log-probs, losses and gradients as padded micro-batches (float64)."""
import pytest
import torch

from memagent.rl.algos import AGG_MODES
from memagent.rl.distributed import DistInfo
from memagent.rl.objectives import SFT, MiniBatch
from memagent.rl.packing import pack_flat, rows_logprobs, token_micro_batches

from rl_helpers import accumulate, dapo, synthetic_minibatch, tiny_model

INFO = DistInfo()


def test_pack_flat_layout():
    flat = pack_flat([[5, 6, 7], [9]], [[1, 2], [3, 4, 8]])
    assert flat.input_ids.tolist() == [[5, 6, 7, 1, 2, 9, 3, 4, 8]]
    assert flat.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3]]
    # row 0: positions 2, 3 predict its response (1, 2); row 1 starts at 5: positions 5, 6, 7 predict 3, 4, 8
    assert flat.keep.tolist() == [2, 3, 5, 6, 7]
    assert flat.slots.tolist() == [0, 1, 3, 4, 5]  # grid of 2 rows x R = 3
    assert flat.response_mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    with pytest.raises(ValueError, match="non-empty prompt"):
        pack_flat([[]], [[1]])


def test_token_micro_batches_by_budget():
    # budget 10: 4 + 5 fit, + 3 would be 12; a 14-token row goes alone; 2 + 7 fit
    assert token_micro_batches([4, 5, 3, 14, 2, 7], 10, INFO) == [[0, 1], [2], [3], [4, 5]]


def test_flat_logprobs_equal_padded():
    model = tiny_model()
    mb = synthetic_minibatch(seed=3, n_samples=4)
    padded = rows_logprobs(model, mb.prompt_ids, mb.response_ids, pad_id=0, micro_batch_size=3, info=INFO)
    flat = rows_logprobs(model, mb.prompt_ids, mb.response_ids, pad_id=0, micro_batch_size=3, info=INFO,
                         micro_batch_tokens=24)
    assert len(flat) == len(padded) == len(mb.response_ids)
    for a, b in zip(padded, flat):
        assert a.shape == b.shape and (a - b).abs().max().item() <= 1e-10
    # the packed sequences really are separate: row 1 alone gives the same log-probs as inside a pack
    alone = rows_logprobs(model, mb.prompt_ids[1:2], mb.response_ids[1:2], pad_id=0, micro_batch_size=1, info=INFO,
                          micro_batch_tokens=24)
    assert (alone[0] - flat[1]).abs().max().item() <= 1e-10


def _grads(model, mb, objective, micro, tokens=0):
    model.zero_grad(set_to_none=True)
    from memagent.rl.objectives import Term, accumulate_gradients

    [metrics] = accumulate_gradients(model, [Term(objective, 1.0, mb)], micro_batch_size=micro, pad_id=0, info=INFO,
                                     micro_batch_tokens=tokens)
    return {n: p.grad.clone() for n, p in model.named_parameters()}, metrics


@pytest.mark.parametrize("attention", ["sdpa", "varlen"])
@pytest.mark.parametrize("agg", AGG_MODES)
def test_packed_gradients_equal_padded(agg, attention):
    """Packed with transformers' block-diagonal sdpa mask, and with per-row varlen attention."""
    from memagent.rl.varlen import use_varlen

    model = tiny_model()
    packed = use_varlen(tiny_model()) if attention == "varlen" else model
    mb = synthetic_minibatch(seed=1, n_samples=4)
    objective = dapo(agg, kl_coef=0.1, horizon=8)
    ref, m_ref = _grads(model, mb, objective, micro=3)
    for tokens in (12, 40, 10_000):  # several rows per pack, and the whole mini-batch as one sequence
        got, m = _grads(packed, mb, objective, micro=3, tokens=tokens)
        diff = max((got[k] - ref[k]).abs().max().item() for k in ref)
        print(f"packed ({attention}) vs padded {agg} micro_batch_tokens={tokens}: max abs grad diff {diff:.2e}")
        assert diff <= 1e-6 and max(g.abs().max().item() for g in ref.values()) > 1e-3
        for key in ("loss", "pg_loss", "kl", "entropy", "clip_frac", "ratio_min", "ratio_max", "tokens"):
            assert m[key] == pytest.approx(m_ref[key], abs=1e-9), key


def test_packed_sft_equal_padded():
    model = tiny_model()
    mb = synthetic_minibatch(seed=5, n_samples=3)
    rows = MiniBatch.supervised(list(zip(mb.prompt_ids, mb.response_ids)))
    ref, m_ref = _grads(model, rows, SFT(), micro=2)
    got, m = _grads(model, rows, SFT(), micro=2, tokens=20)
    assert max((got[k] - ref[k]).abs().max().item() for k in ref) <= 1e-6
    assert m["loss"] == pytest.approx(m_ref["loss"], abs=1e-9)
    assert m["token_accuracy"] == m_ref["token_accuracy"]


@pytest.mark.slow
def test_two_processes_with_different_pack_counts_equal_one_padded_process(tmp_path):
    """torchrun (gloo), FSDP2: rank 0 packs 1 sample, rank 1 three, so their pack counts differ."""
    from safetensors.torch import load_file

    from rl_helpers import torchrun

    torchrun("dist_pack_script.py", tmp_path)
    want, m = _grads(tiny_model(), synthetic_minibatch(seed=1, n_samples=4), dapo("seq-mean-token-mean"), micro=3)
    for strategy in ("fsdp",):
        got = load_file(tmp_path / f"packed_{strategy}.safetensors")
        packs = got.pop("__packs__").tolist()
        assert packs[0] < packs[1], packs  # the dummy forwards of rank 0 kept the collectives in step
        assert got.pop("__loss__").item() == pytest.approx(m["loss"], abs=1e-12)
        diff = max((got[k] - want[k]).abs().max().item() for k in want)
        print(f"packed, 2 processes ({strategy}, packs {packs}) vs padded, 1 process: max abs grad diff {diff:.2e}")
        assert diff <= 1e-12, (strategy, diff)
