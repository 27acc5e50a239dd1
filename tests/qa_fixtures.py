"""Test data written by the tests: a small local tokenizer and QA sources in the public formats."""
from __future__ import annotations

import json
import random

import pytest


@pytest.fixture(scope="session")
def tokenizer(tiny_tokenizer):
    """The project's tiny byte-level tokenizer (the session's `tiny_tokenizer`)."""
    return tiny_tokenizer


WORDS = (
    "river stone light house music garden forest winter paper market bridge castle silver doctor "
    "island mirror engine letter summer window valley rocket island harbor painter temple coffee "
    "number planet yellow orange purple simple golden animal little bottle button circle common "
    "famous gentle hidden honest modern narrow normal public remote single strong sudden useful"
).split()


def make_hotpot(n_questions: int, seed: int = 0, sentences: int = 2) -> list[dict]:
    """A HotpotQA-format list: each question has 10 paragraphs, the first 2 gold."""
    rng = random.Random(seed)
    data = []
    for q in range(n_questions):
        answer = f"{rng.choice(WORDS)}{q}"
        context = []
        for j in range(10):
            title = f"Topic {q}-{j}"
            sents = [" ".join(rng.choice(WORDS) for _ in range(6)) + ". " for _ in range(sentences)]
            if j == 1:
                sents[0] = f"The key of item {q} is {answer}. "
            context.append([title, sents])
        data.append({
            "_id": f"q{q:05d}",
            "question": f"What is the key of item {q} named in Topic {q}-0?",
            "answer": answer,
            "supporting_facts": [[f"Topic {q}-0", 0], [f"Topic {q}-1", 0]],
            "context": context,
            "type": "bridge",
            "level": "hard",
        })
    return data


@pytest.fixture(scope="session")
def hotpot_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("hotpot") / "hotpot_small.json"
    path.write_text(json.dumps(make_hotpot(60)), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def hotpot_large_file(tmp_path_factory):
    """2,600 questions, 26,000 distinct paragraphs: enough for a 25,600-document sample."""
    path = tmp_path_factory.mktemp("hotpot_large") / "hotpot_large.json"
    path.write_text(json.dumps(make_hotpot(2600, seed=1, sentences=1)), encoding="utf-8")
    return path


def make_squad(n_articles: int = 15, paragraphs: int = 4, seed: int = 0) -> dict:
    rng = random.Random(seed)
    data = []
    for a in range(n_articles):
        paras = []
        for p in range(paragraphs):
            answer = f"{rng.choice(WORDS)}{a}x{p}"
            text = " ".join(rng.choice(WORDS) for _ in range(30)) + f". The code of place {a}-{p} is {answer}."
            qas = [{"id": f"s{a}-{p}", "question": f"What is the code of place {a}-{p}?",
                    "answers": [{"text": answer, "answer_start": text.index(answer)}], "is_impossible": False}]
            if p == 0:
                qas.append({"id": f"s{a}-{p}-imp", "question": "Unanswerable?", "answers": [], "is_impossible": True})
            paras.append({"context": text, "qas": qas})
        data.append({"title": f"Article {a}", "paragraphs": paras})
    return {"version": "v2.0", "data": data}


@pytest.fixture(scope="session")
def squad_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("squad") / "squad_small.json"
    path.write_text(json.dumps(make_squad()), encoding="utf-8")
    return path
