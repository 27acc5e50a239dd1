"""The demo's supervised rows: the warm-up's demonstrations and the value-copy rows of `rl_copy_coef`."""
import random

from memagent.demo.pipeline import DemoConfig, value_copy_rows
from memagent.tasks.toy import ToySpec, build_toy_tokenizer


def test_value_copy_rows_ask_for_the_value_after_the_written_key():
    tok = build_toy_tokenizer(ToySpec())
    cfg = DemoConfig(rl_copy_rows=2000)
    rows = value_copy_rows(cfg, tok, random.Random(0))
    # left out: answers from an empty memory (a random value: 0.2 of rows x 0.3 empty memories) and updates
    # whose chunk holds the memory's key with another value (~0.8 x 0.7 x 1/(keys - 1)): 10 keys, ~1758 kept
    left_out = 0.2 * 0.3 + 0.8 * 0.7 / (cfg.spec.n_keys - 1)
    assert cfg.spec.n_keys == 10 and abs(len(rows) - 2000 * (1 - left_out)) < 60
    kinds = {"keep": 0, "copy": 0, "answer": 0}
    for prompt, response in rows:
        words = tok.convert_ids_to_tokens(prompt)
        assert len(response) == 1
        value, written = tok.convert_ids_to_tokens(response)[0], words[-1]
        memory = words[1:3]  # "M k v ..." (the toy prompts have no BOS)
        if written == "\\boxed{":  # answer: the memory's value
            assert words[0] == "M" and value == memory[1] != "none"
            kinds["answer"] += 1
        elif written == memory[0]:  # kept the memory: its value (or "none" after "none")
            assert value == memory[1]
            kinds["keep"] += 1
        else:  # copied the chunk's fact "fact KEY VALUE"
            at = words.index("fact")
            assert words[at + 1] == written and value == words[at + 2]
            kinds["copy"] += 1
    assert min(kinds.values()) > 200, kinds


def test_rl_questions_default_is_the_training_length_and_rl_chunks_mixes_equal_shares():
    from collections import Counter

    from memagent.demo.pipeline import DemoConfig, rl_questions
    from memagent.tasks.toy import make_samples

    cfg = DemoConfig(seed=3, rl_steps=5, rl_batch=4)  # 20 questions
    assert rl_questions(cfg) == make_samples(cfg.spec, 4, 20, 3, prefix="train")
    mixed = rl_questions(DemoConfig(seed=3, rl_steps=5, rl_batch=4, rl_chunks=(2, 4, 8)))
    assert Counter(s["id"].split("-")[1] for s in mixed) == {"2": 7, "4": 7, "8": 6}
    assert [len(s["context"].split()) for s in mixed if s["id"].startswith("train-8-")][0] == 8 * 9
    assert mixed == rl_questions(DemoConfig(seed=3, rl_steps=5, rl_batch=4, rl_chunks=(2, 4, 8)))  # seeded


def test_two_hop_rl_questions_follow_rl_chunks_too():
    """The two-hop demo's RL questions come from the same `rl_questions`: two-hop samples of `train_chunks`
    chunks by default, and equal shares of each `rl_chunks` length when it is set."""
    from collections import Counter

    from memagent.demo.pipeline import rl_questions
    from memagent.demo.two_hop import TwoHopConfig
    from memagent.tasks.toy import make_samples

    cfg = TwoHopConfig(seed=3, rl_steps=5, rl_batch=4)
    assert rl_questions(cfg, two_hop=True) == make_samples(cfg.spec, 4, 20, 3, prefix="train", two_hop=True)
    mixed = rl_questions(TwoHopConfig(seed=3, rl_steps=5, rl_batch=4, rl_chunks=(2, 8)), two_hop=True)
    assert Counter(s["num_chunks"] for s in mixed) == {2: 10, 8: 10}
    assert all(s["task"] == "toy-two-hop" and s["order"] in ("value-first", "pointer-first") for s in mixed)
