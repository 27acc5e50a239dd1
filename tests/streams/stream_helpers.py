"""What the stream tests share: a deterministic scripted model, a GPT-2-style tokenizer, and `memagent ask`'s run
over a text (the reference a standing question must equal)."""
from __future__ import annotations

import hashlib
import random
import re

from fakes import ScriptedBackend

from memagent.agent.registry import AgentInput, build_workflow, run_workflow

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa quebec "
         "romeo sierra tango uniform victor whiskey xray yankee zulu Berlin Paris moved lives key value").split()


def scripted_reply(prompt: str, _: int) -> str:
    """A 'greedy' model: the same prompt, the same reply. A memory update keeps two words of the old memory, two of
    the section and a digest of the whole prompt (so a different prompt gives a different memory); the final call
    boxes the memory's first word."""
    digest = hashlib.sha256(prompt.encode()).hexdigest()[:6]
    memory = re.search(r"<memory>\s*(.*?)\s*</memory>", prompt, re.S)
    section = re.search(r"<section>\s*(.*?)\s*</section>", prompt, re.S)
    old = memory.group(1).split()[:2] if memory else []
    if section is None:  # the final call
        return f"The answer is \\boxed{{{(old or ['none'])[0]}-{digest}}}"
    new = section.group(1).split()[-2:]
    return " ".join(old[:1] + new + [digest])


def scripted_backend(tokenizer) -> ScriptedBackend:
    return ScriptedBackend(tokenizer, scripted_reply)


def random_events(rng: random.Random, n: int) -> list[dict]:
    """n events of 1-40 words, some spanning several lines, with roles, times and sometimes a source."""
    out = []
    for i in range(n):
        lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 20))) for _ in range(rng.randint(1, 3))]
        text = "\n".join(lines) + rng.choice(["", ".", "!", "  ", "\n"])
        out.append(dict(text=text, role=rng.choice(["user", "assistant", "tool"]),
                        time=f"2026-01-{1 + i % 28:02d}T{rng.randint(0, 23):02d}:00:00Z",
                        source=rng.choice([None, "chat", "mail"])))
    return out


def ask_reference(backend, config, text: str, question: str) -> tuple[list[dict], object]:
    """`memagent ask` over `text` (the same run: build_workflow("memagent") on the text): its memory records, in
    order, and its result."""
    records: list[dict] = []
    runner = build_workflow("memagent", backend, config, on_step=records.append, failures="raise")
    result = run_workflow(runner, [AgentInput(question, text, "0")])[0]
    return [r for r in records if r.get("kind", "memory") == "memory"], result


def gpt2_style_tokenizer(vocab_size: int = 1024):
    """A byte-level BPE with GPT-2's pre-tokeniser regex (SmolLM2's kind), trained here on the words above."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    rng = random.Random(0)
    corpus = ["[2026-01-01T00:00:00Z] user:\n" + " ".join(rng.choice(WORDS) for _ in range(12)) + ".\n\n"
              for _ in range(500)]  # each ends a paragraph: "\n\n" becomes one token, as in GPT-2's vocabulary
    tok.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
