"""The trainer's log-probs see the distribution the rollout samples from (issue 24, class 16): with an embedding
padded past the tokenizer, generation masks the ids that have no text (`VocabMask`) and scoring cuts them off,
so the trainer's softmax (old, reference and new log-probs, the loss) runs over the same ids; the padded rows of
the output layer get no gradient and do not move."""
import pytest
import torch

from rl_helpers import tiny_model
from test_rl_trainer import samples, small_config, symbol_reward

from memagent.backends.hf import TransformersBackend, vocab_limit
from memagent.rl.distributed import init_distributed
from memagent.rl.packing import rows_logprobs
from memagent.rl.trainer import train

PAD = 64  # rows past the tokenizer, as real models pad to a multiple of 64 or 128


@pytest.fixture(scope="module")
def tok():
    from memagent.backends.tiny import build_tokenizer

    return build_tokenizer()


def padded_model(tok, seed=0):
    from transformers import AutoModelForCausalLM

    from memagent.backends.tiny import tiny_config

    cfg = tiny_config(len(tok) + PAD, hidden_size=48, intermediate_size=96, num_attention_heads=4,
                      num_key_value_heads=2)
    cfg.eos_token_id, cfg.pad_token_id = tok.eos_token_id, tok.pad_token_id
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    model.generation_config.eos_token_id = [tok.eos_token_id, tok.pad_token_id]
    model.generation_config.pad_token_id = tok.pad_token_id
    return model.eval()


def test_the_limit_is_the_tokenizer_only_when_the_embedding_is_larger(tok):
    assert vocab_limit(padded_model(tok), tok) == len(tok) == 774
    assert vocab_limit(tiny_model(vocab=len(tok)), tok) is None  # nothing to mask


def test_the_trainers_logprobs_are_the_rollouts_scores(tok):
    model = padded_model(tok)
    prompts = [tok("the river is")["input_ids"], tok("key 3 has the value")["input_ids"]]
    responses = [tok(" blue and old")["input_ids"], tok(" 21")["input_ids"]]
    backend = TransformersBackend(model, tok, use_chat_template=False)
    scores = backend.score(prompts, responses, temperature=0.7)  # what a rollout's log-probs hold
    info = init_distributed("cpu")
    got = rows_logprobs(model, prompts, responses, pad_id=tok.pad_token_id, micro_batch_size=8, info=info,
                        temperature=0.7, vocab_limit=vocab_limit(model, tok))
    full = rows_logprobs(model, prompts, responses, pad_id=tok.pad_token_id, micro_batch_size=8, info=info,
                         temperature=0.7)
    for s, g, f in zip(scores, got, full):
        assert torch.allclose(g.double(), torch.tensor(s, dtype=torch.float64), atol=1e-5)
        assert (g - f).min() > 1e-4  # the full softmax gives the padded ids mass: every token's log-prob lower
    # by hand: the first response token, softmax over the tokenizer's 774 ids
    with torch.no_grad():
        logits = model(torch.tensor([prompts[0]])).logits[0, -1].double() / 0.7  # (774 + PAD,)
    want = torch.log_softmax(logits[: len(tok)], -1)[responses[0][0]]
    assert abs(float(got[0][0]) - float(want)) < 1e-5


def test_training_leaves_the_padded_rows_of_the_output_layer_alone(tok, tmp_path):
    model = padded_model(tok)
    head = model.get_output_embeddings().weight
    before = head.detach().clone()
    cfg = small_config(tmp_path / "run", "total_steps=1", "rollout.batch_size=2", "rollout.group_size=4",
                       "update.mini_batch_size=2", "optim.weight_decay=0")
    train(cfg, samples(4), symbol_reward, model=model, tokenizer=tok)
    after = model.get_output_embeddings().weight.detach()
    assert not torch.equal(after[: len(tok)], before[: len(tok)])  # the step did train
    assert torch.equal(after[len(tok):], before[len(tok):])  # zero gradient, and Adam moves nothing on it
