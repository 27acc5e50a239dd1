import torch

from memagent.backends.base import SamplingParams
from memagent.backends.hf import TransformersBackend


def test_logprobs_match_an_independent_forward_pass(tiny_backend):
    be = TransformersBackend(tiny_backend.model, tiny_backend.tokenizer, want_logprobs=True)
    prompts = ["city river memory", "a much longer prompt about the key and the value of it"]
    gens = be.generate(prompts, SamplingParams(max_new_tokens=5, temperature=1.0, seed=3))
    for g in gens:
        assert len(g.logprobs) == len(g.token_ids) > 0
        ids = torch.tensor([g.prompt_token_ids + g.token_ids])
        with torch.no_grad():
            logp = torch.log_softmax(be.model(ids).logits[0].float(), -1)
        n = len(g.prompt_token_ids)
        ref = [logp[n - 1 + t, tok].item() for t, tok in enumerate(g.token_ids)]
        assert max(abs(a - b) for a, b in zip(g.logprobs, ref)) < 1e-4


def test_seeded_sampling_is_reproducible_and_greedy_is_argmax(tiny_backend):
    p = SamplingParams(max_new_tokens=6, temperature=1.0, seed=11)
    a = tiny_backend.generate(["memory key value"] * 3, p)
    b = tiny_backend.generate(["memory key value"] * 3, p)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    g = tiny_backend.generate(["memory key value"], SamplingParams(max_new_tokens=1))[0]
    with torch.no_grad():
        logits = tiny_backend.model(torch.tensor([g.prompt_token_ids])).logits[0, -1]
    assert g.token_ids[0] == int(logits.argmax())


def test_chat_template_is_used_and_eos_ends_the_text(tiny_backend):
    ids = tiny_backend.encode("hello")
    text = tiny_backend.tokenizer.decode(ids)
    assert text.startswith("<|im_start|>user\nhello<|im_end|>") and text.endswith("<|im_start|>assistant\n")
    assert tiny_backend.prompt_length("hello") == len(ids)
    raw = TransformersBackend(tiny_backend.model, tiny_backend.tokenizer, use_chat_template=False)
    assert raw.encode("hello") == tiny_backend.tokenizer("hello")["input_ids"]


def test_saved_tiny_model_loads_back_with_the_same_tokenizer(tiny_model_dir, tiny_tokenizer):
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = "fact12 is value 3.5 — 東京 música\n\n  end"
    assert loaded(text)["input_ids"] == tiny_tokenizer(text)["input_ids"]
    assert loaded.decode(loaded(text)["input_ids"]) == text  # byte-level: any UTF-8 round-trips
