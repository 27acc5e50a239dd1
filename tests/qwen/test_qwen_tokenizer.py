"""The real Qwen tokenizer and Qwen3 chat template through the project's token handling: chunking to exact
token counts, the question and window budgets, `chat_template_kwargs` (enable_thinking), think-block
stripping, `<|im_end|>` as the stop token and `<|endoftext|>` as the pad token.

The model is tests/qwen_fixture.py's scripted tiny Qwen3: greedy, it replies REPLY_THINKING (thinking on) or
REPLY_PLAIN (enable_thinking false), then `<|im_end|>`."""
from __future__ import annotations

import random

import pytest
import torch

from qwen_fixture import ANSWER, REPLY_PLAIN, REPLY_THINKING

from memagent.agent.chunking import iter_chunks
from memagent.prompts import render
from memagent.agent.workflow import AgentInput, BudgetError, MemoryAgent
from memagent.backends.base import SamplingParams
from memagent.config import PAPER_MEMORY_TEMPLATE, PLACEHOLDER, AgentConfig

IM_START, IM_END, ENDOFTEXT, THINK, END_THINK = 151644, 151645, 151643, 151667, 151668  # Qwen's added tokens
NL, NL2 = 198, 271  # "\n", "\n\n"


def mixed_text(n_words: int, seed: int = 0) -> str:
    """English, accents, CJK, emoji (4-byte and joined), numbers and blank lines: chunk cuts land inside
    multi-byte characters and inside words."""
    pieces = ("the river Paris café naïve 東京タワー 🙂🎉 👨‍👩‍👧 don't 12345 3.14 hello-world 漢字かな交じり文 "
              "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 .\n\nNew").split(" ")
    rng = random.Random(seed)
    return " ".join(rng.choice(pieces) for _ in range(n_words))


# -- chunking ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("chunk_tokens", [1, 3, 7, 64, 5000])
def test_chunks_have_exact_qwen_token_counts_and_the_documented_round_trip(qwen_tokenizer, chunk_tokens):
    """The invariant iter_chunks holds with Qwen's byte-level BPE (document with word boundaries):
    - every chunk but the last has exactly C ids, the last 1..C; chunk k starts at token k*C;
    - the chunks' ids, concatenated, are the ids of tokenising the whole text at once (blocks do not show),
      and decode back to the text byte for byte;
    - chunk.text == decode(chunk.token_ids); a chunk whose text holds no U+FFFD re-encodes to exactly its ids;
      a chunk cut inside a multi-byte character shows U+FFFD at the cut and re-encodes to at most its C ids."""
    tok = qwen_tokenizer
    text = mixed_text(1500)
    whole = tok(text, add_special_tokens=False)["input_ids"]
    for block_chars in (1 << 16, 700):
        chunks = list(iter_chunks(text, tok, chunk_tokens, block_chars=block_chars))
        assert [len(c.token_ids) for c in chunks[:-1]] == [chunk_tokens] * (len(chunks) - 1)
        assert 1 <= len(chunks[-1].token_ids) <= chunk_tokens
        assert [c.start_token for c in chunks] == [k * chunk_tokens for k in range(len(chunks))]
        joined = [i for c in chunks for i in c.token_ids]
        assert joined == whole
        assert tok.decode(joined) == text
        for c in chunks:
            assert c.text == tok.decode(c.token_ids)
            again = tok(c.text, add_special_tokens=False)["input_ids"]
            if "\ufffd" in c.text:
                assert len(again) <= chunk_tokens
            else:
                assert again == c.token_ids, (c.index, c.text)
    if chunk_tokens <= 7:  # small chunks do cut characters: the U+FFFD branch above was exercised
        assert any("\ufffd" in c.text for c in chunks)


def test_a_block_cut_without_spaces_costs_at_most_two_tokens_a_cut(qwen_tokenizer):
    """The documented departure: a text without spaces (Japanese) is cut where a block ends, and Qwen may
    tokenise across that cut differently; the text still decodes byte for byte and the chunks stay exact."""
    tok = qwen_tokenizer
    rng = random.Random(1)
    text = "".join(rng.choice(["東京タワー", "漢字かな交じり文", "日本語の文章", "です。", "中文句子"]) for _ in range(3000))
    whole = tok(text, add_special_tokens=False)["input_ids"]
    block_chars = 5000
    chunks = list(iter_chunks(text, tok, 64, block_chars=block_chars))
    joined = [i for c in chunks for i in c.token_ids]
    assert tok.decode(joined) == text
    assert [len(c.token_ids) for c in chunks[:-1]] == [64] * (len(chunks) - 1)
    cuts = len(text) // block_chars
    assert 0 <= len(joined) - len(whole) <= 2 * cuts


# -- budgets ----------------------------------------------------------------------------------------------------
def test_a_question_over_its_budget_in_qwen_tokens_is_refused(qwen_backend, qwen_tokenizer):
    """" Paris" is one Qwen token, "𓀀" (a hieroglyph, four bytes) three: the budget counts Qwen tokens, not characters."""
    assert qwen_tokenizer(" Paris", add_special_tokens=False)["input_ids"] == [12095]
    assert qwen_tokenizer("𓀀", add_special_tokens=False)["input_ids"] == [124373, 222, 222]
    agent = MemoryAgent(qwen_backend, AgentConfig(chunk_tokens=64, memory_tokens=16, answer_tokens=16, query_tokens=12))
    agent.check_budget([AgentInput("Paris" + " Paris" * 11, "doc")])  # 12 tokens: fits
    agent.check_budget([AgentInput("𓀀" * 4, "doc")])  # 4 characters, 12 tokens: fits
    with pytest.raises(BudgetError, match="has 13 tokens, over its budget of 12"):
        agent.check_budget([AgentInput("Paris" + " Paris" * 12, "doc")])
    with pytest.raises(BudgetError, match="has 15 tokens, over its budget of 12"):
        agent.check_budget([AgentInput("𓀀" * 5, "doc")])  # 5 characters


@pytest.mark.parametrize("kwargs, markup", [({}, 8), ({"enable_thinking": False}, 12)])
def test_the_window_check_counts_the_qwen3_chat_markup(qwen_backend, qwen_tokenizer, kwargs, markup):
    """A memory call takes template + query + chunk + 2 * memory tokens. The Qwen3 markup around one user turn
    is 8 tokens (<|im_start|> user \\n ... <|im_end|> \\n <|im_start|> assistant \\n), 4 more with the empty
    think block (<think> \\n\\n </think> \\n\\n) that enable_thinking=false writes."""
    from memagent.backends.hf import TransformersBackend

    body = len(qwen_tokenizer(render(PAPER_MEMORY_TEMPLATE, question="", memory="", chunk=""),
                              add_special_tokens=False)["input_ids"])
    # Qwen's BPE merges the pieces of the empty render ("\n" + "\n" -> "\n\n") that filled fields keep apart:
    # filled prompts measured up to 3 tokens over `body`, so the check counts the template's pieces one by one
    pieces = [p for p in PLACEHOLDER.split(PAPER_MEMORY_TEMPLATE)[::2] if p]
    merged = sum(len(qwen_tokenizer(p, add_special_tokens=False)["input_ids"]) for p in pieces) - body
    assert merged == 3
    cfg = AgentConfig(chunk_tokens=1000, memory_tokens=100, answer_tokens=100, query_tokens=50)
    need = body + merged + markup + 50 + 1000 + 2 * 100
    fits = TransformersBackend(qwen_backend.model, qwen_tokenizer, max_window=need, chat_template_kwargs=kwargs)
    assert fits.prompt_length(render(PAPER_MEMORY_TEMPLATE, question="", memory="", chunk="")) == body + markup
    MemoryAgent(fits, cfg).check_budget([AgentInput("q?", "doc")])
    short = TransformersBackend(qwen_backend.model, qwen_tokenizer, max_window=need - 1, chat_template_kwargs=kwargs)
    with pytest.raises(BudgetError, match=f"needs up to {need} tokens .* window is {need - 1}"):
        MemoryAgent(short, cfg).check_budget([AgentInput("q?", "doc")])


# -- chat template kwargs and think blocks ----------------------------------------------------------------------
def test_enable_thinking_false_writes_the_empty_think_block_and_changes_the_reply(qwen_backend, qwen_tokenizer):
    from memagent.backends.hf import TransformersBackend

    plain = TransformersBackend(qwen_backend.model, qwen_tokenizer, chat_template_kwargs={"enable_thinking": False})
    assert qwen_backend.render("hi") == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert plain.render("hi") == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert plain.encode("hi")[-4:] == [THINK, NL2, END_THINK, NL2]
    assert qwen_backend.encode("hi")[-3:] == [IM_START, 77091, NL]  # <|im_start|> assistant \n
    params = SamplingParams(32)
    assert qwen_backend.generate(["hi"], params)[0].text == REPLY_THINKING
    assert plain.generate(["hi"], params)[0].text == REPLY_PLAIN


def test_a_profile_passes_chat_template_kwargs_to_the_backend(qwen_model_dir):
    from memagent.backends.options import BackendOptions
    from memagent.protocol.profile import Profile, open_backend

    backend = open_backend(str(qwen_model_dir), BackendOptions(device="cpu", dtype="float32"),
                           Profile(chat_template_kwargs={"enable_thinking": False}))
    assert backend.render("hi").endswith("<think>\n\n</think>\n\n")


@pytest.mark.parametrize("think", ["strip", "keep"])
def test_think_blocks_are_cut_before_the_memory_and_the_answer(qwen_backend, think):
    """The workflow strips each reply up to its last </think> (agent/answer.py strip_think, called by
    workflow._take_memory and final_answer). <think> and </think> are added tokens that are NOT special in
    Qwen3's tokenizer, so decoding with skip_special_tokens keeps them for strip_think to find."""
    records = []
    cfg = AgentConfig(chunk_tokens=32, memory_tokens=16, answer_tokens=16, query_tokens=32, think=think)
    doc = mixed_text(60)
    r = MemoryAgent(qwen_backend, cfg, on_step=records.append).run([AgentInput("Capital of France?", doc)])[0]
    memories = [rec["memory"] for rec in records if rec.get("kind") != "final"]
    assert len(memories) == r.num_chunks >= 2
    expected = REPLY_PLAIN if think == "strip" else REPLY_THINKING
    assert memories == [expected] * r.num_chunks
    assert [rec["think_removed"] for rec in records] == [think == "strip"] * (r.num_chunks + 1)
    assert r.raw_answer == REPLY_THINKING and r.answer == ANSWER
    assert r.think_removed is (think == "strip")


# -- stop and pad tokens ----------------------------------------------------------------------------------------
def test_im_end_stops_generation_and_is_kept_in_the_ids_not_the_text(qwen_backend, qwen_tokenizer):
    assert qwen_tokenizer.eos_token == "<|im_end|>" and qwen_backend.eos_ids == [ENDOFTEXT, IM_END]
    reply_ids = qwen_tokenizer(REPLY_THINKING, add_special_tokens=False)["input_ids"]  # 10 ids
    g = qwen_backend.generate(["hi"], SamplingParams(64))[0]
    assert g.token_ids == reply_ids + [IM_END] and g.finish_reason == "stop" and g.text == REPLY_THINKING
    cut = qwen_backend.generate(["hi"], SamplingParams(len(reply_ids)))[0]  # no room for <|im_end|>
    assert cut.token_ids == reply_ids and cut.finish_reason == "length"
    # the model's generation_config samples (temperature 0.6, top_k 20, as Qwen3 ships); greedy overrides it
    assert qwen_backend.model.generation_config.do_sample is True
    seeded = [qwen_backend.generate(["hi"], SamplingParams(64, seed=s))[0].token_ids for s in (1, 2)]
    assert seeded == [g.token_ids] * 2


def test_im_end_stops_generation_when_the_generation_config_names_only_endoftext(qwen_backend, qwen_tokenizer):
    """A base-model generation_config (eos <|endoftext|> alone): the tokenizer's EOS, <|im_end|>, still stops."""
    from memagent.backends.hf import TransformersBackend

    gen = qwen_backend.model.generation_config
    saved = gen.eos_token_id
    gen.eos_token_id = ENDOFTEXT
    try:
        backend = TransformersBackend(qwen_backend.model, qwen_tokenizer)
    finally:
        gen.eos_token_id = saved
    assert backend.eos_ids == [ENDOFTEXT, IM_END]
    assert backend.generate(["hi"], SamplingParams(64))[0].token_ids[-1] == IM_END


def test_the_pad_token_is_endoftext_and_padding_changes_no_row(qwen_backend, qwen_tokenizer):
    """Qwen pads with <|endoftext|> (not its EOS): ensure_pad_token keeps it. Rows of different lengths in one
    batch (left padded for generation, right padded for scoring) get what each gets alone."""
    from memagent.backends.tokenizer import ensure_pad_token

    assert ensure_pad_token(qwen_tokenizer).pad_token == "<|endoftext|>"
    assert qwen_backend.tokenizer.pad_token_id == ENDOFTEXT != qwen_backend.tokenizer.eos_token_id
    prompts = ["hi", "Capital of France? " * 20, mixed_text(40)]
    together = qwen_backend.generate(prompts, SamplingParams(64))
    alone = [qwen_backend.generate([p], SamplingParams(64))[0] for p in prompts]
    assert [g.token_ids for g in together] == [g.token_ids for g in alone]
    assert all(ENDOFTEXT not in g.token_ids for g in together)
    # scoring ids the chain does not predict: log-probs that depend on every attended position
    rows = [qwen_backend.encode(p) for p in prompts]
    responses = [[100, 200, 300], [4000], [5, 6, 7, 8, 9]]
    batched = qwen_backend.score(rows, responses)
    for row, resp, lp in zip(rows, responses, batched):
        single = qwen_backend.score([row], [resp])[0]
        assert torch.allclose(torch.tensor(lp), torch.tensor(single), atol=1e-5)
        assert all(x < -5 for x in single)  # far from certain: the random layers decide these


def test_filled_memory_prompts_never_exceed_the_window_checks_bound(qwen_backend, qwen_tokenizer):
    """The bound `template_overhead` gives holds for filled prompts (2,000 random fills of question, memory and
    chunk cut to exact token counts), where the empty render's length alone fell 3 tokens short."""
    import random

    from memagent.agent.workflow import template_overhead

    def n(text: str) -> int:
        return len(qwen_tokenizer(text, add_special_tokens=False)["input_ids"])

    rng = random.Random(0)
    words = "the river city of a memory k7 is v5 document 3 : , . ( ) and to in who wrote letter \n".split(" ")

    def text_of(k: int) -> str:
        ids = qwen_tokenizer(" ".join(rng.choice(words) for _ in range(2 * k)), add_special_tokens=False)["input_ids"]
        return qwen_tokenizer.decode(ids[:k])

    bound = template_overhead(qwen_backend, PAPER_MEMORY_TEMPLATE) - qwen_backend.prompt_length("") + n("")
    empty = n(render(PAPER_MEMORY_TEMPLATE, question="", memory="", chunk=""))
    over_bound = over_empty = -99
    for _ in range(2000):
        q, m, c = text_of(rng.randint(1, 30)), text_of(rng.randint(0, 30)), text_of(rng.randint(1, 60))
        full = n(render(PAPER_MEMORY_TEMPLATE, question=q, memory=m, chunk=c))
        over_bound = max(over_bound, full - (bound + n(q) + n(m) + n(c)))
        over_empty = max(over_empty, full - (empty + n(q) + n(m) + n(c)))
    assert over_bound <= 0 < over_empty
