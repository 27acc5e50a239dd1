"""Conversations (memagent.streams.formats) written as stream files and sample JSONL, and look-alikes made offline.

`write_conversations(conversations, out)` writes `OUT.jsonl`, one sample per question (our sample format,
docs/data.md, so `memagent eval --data OUT.jsonl` scores it), and beside it the folder `OUT.streams/` with one
stream file per conversation (`NAME.stream`: `memagent stream ask|watch|show` read it) and its text (`NAME.txt`,
the sample's `document`). Each sample carries `stream`, `ability`, `abstention`, `evidence` (the gold turns' texts)
and `evidence_ids` (the benchmark's session or dialogue ids) besides the usual fields; `length` is the stream's
number of events (`length_unit` "events").

`look_alikes(...)` (`memagent data streams`) makes multi-session chats whose facts change over time, with
timestamps, and questions typed by ability, each with its evidence: information extraction (a fact said once),
knowledge update (the current value of a fact that changed), temporal reasoning (when a change happened),
multi-session aggregation (how many values a fact has had) and abstention (never mentioned: gold "not mentioned").
The same seed gives the same files.
"""
from __future__ import annotations

import hashlib
import random
import re
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Iterable

from memagent.streams.events import StreamError
from memagent.streams.formats import NOT_MENTIONED, Conversation
from memagent.streams.stream import Stream
from memagent.tasks.base import write_samples

CITIES = ["Berlin", "Paris", "Lisbon", "Oslo", "Madrid", "Vienna", "Prague", "Dublin", "Warsaw", "Athens"]
JOBS = ["nurse", "teacher", "plumber", "chemist", "pilot", "baker", "lawyer", "architect", "farmer", "editor"]
PETS = ["Biscuit", "Luna", "Pepper", "Milo", "Nala", "Otis", "Rocky", "Daisy"]
NEVER = ["sister's name", "favourite film", "car's colour", "blood type", "shoe size"]
SMALL_TALK = ["The weather was grey all day.", "I read a few pages of a novel tonight.",
              "Lunch was a quick sandwich again.", "Traffic was slow this morning.",
              "I tried a new recipe with lentils.", "My phone needed an update.", "The gym was crowded today."]
REPLIES = ["That sounds nice.", "Thanks for telling me.", "Noted.", "I hope the week goes well.", "Good to know."]


def safe_name(text: str) -> str:
    """A file name for a conversation id: its own when plain, else a digest."""
    if re.fullmatch(r"[A-Za-z0-9_.\-]{1,80}", text) and not text.startswith("."):
        return text
    return "c" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def write_conversations(conversations: Iterable[Conversation], out: str | Path) -> tuple[int, int]:
    """Write the stream files, their texts and the samples (see the module's docstring); (streams, questions)."""
    out = Path(out)
    folder = out.with_name(out.stem + ".streams")
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise StreamError(f"{folder} already exists and is not an empty folder; remove it, or give another --out")
    folder.mkdir(parents=True, exist_ok=True)
    samples: list[dict[str, Any]] = []
    names: set[str] = set()
    n_streams = 0
    for conv in conversations:
        name = safe_name(conv.id)
        if name in names:
            raise StreamError(f"two conversations have the id {conv.id!r}; ids must be unique")
        names.add(name)
        with Stream.create(folder / f"{name}.stream", name=conv.id) as s:
            if conv.events:
                s.append_many(conv.events)
            with open(folder / f"{name}.txt", "w", encoding="utf-8") as fh:
                for block in s.text_blocks():
                    fh.write(block)
        n_streams += 1
        for q in conv.questions:
            sample = dict(id=q["id"], task=q["task"], question=q["question"], answers=q["answers"], metric=q["metric"],
                          length=len(conv.events), length_unit="events", document=f"{folder.name}/{name}.txt",
                          stream=f"{folder.name}/{name}.stream", ability=q["ability"], abstention=q["abstention"],
                          evidence_ids=q["evidence_ids"])
            if q["evidence"]:
                sample["evidence"] = q["evidence"]
            samples.append(sample)
    write_samples(samples, out)
    return n_streams, len(samples)


def look_alikes(conversations: int, sessions: int, seed: int) -> list[Conversation]:
    """`conversations` chats of `sessions` sessions each (a session a few days after the last), seeded."""
    rng = random.Random(seed)
    out = []
    for c in range(conversations):
        conv = Conversation(f"chat{c:04d}")
        day = datetime(2026, 1, 1) + timedelta(days=rng.randint(0, 300))
        city, job, pet = rng.choice(CITIES), rng.choice(JOBS), rng.choice(PETS)
        cities = [(city, day, f"I live in {city}.")]
        facts = [f"I live in {city}.", f"I work as a {job}.", f"My dog is called {pet}."]
        pet_said = None
        for s in range(sessions):
            at = day.replace(hour=9) + timedelta(minutes=0)
            turns: list[str] = []
            if s == 0:
                turns += facts[:2]
            if s == sessions // 2:
                turns.append(facts[2])
                pet_said = facts[2]
            if s > 0 and rng.random() < 0.5:
                city = rng.choice([x for x in CITIES if x != city])
                text = f"Big news: I moved to {city} this week."
                cities.append((city, day, text))
                turns.append(text)
            turns += rng.sample(SMALL_TALK, 2)
            rng.shuffle(turns)
            for t, text in enumerate(turns):
                when = (at + timedelta(minutes=2 * t)).strftime("%Y-%m-%dT%H:%M:00Z")
                conv.events.append(dict(text=text, role="user", time=when, source=f"session {s}"))
                conv.events.append(dict(text=rng.choice(REPLIES), role="assistant", time=when, source=f"session {s}"))
            day += timedelta(days=rng.randint(1, 9))
        moved = cities[-1]
        q = lambda i, question, answer, ability, evidence: dict(  # noqa: E731
            id=f"{conv.id}-{i}", question=question, answers=[answer], metric="sub_em", task=f"streams/{ability}",
            ability=ability, abstention=ability == "abstention", evidence=evidence, evidence_ids=[])
        conv.questions = [
            q("ie", "What is the name of the user's dog?", pet, "information-extraction", [pet_said or facts[2]]),
            q("ku", "Which city does the user live in now?", moved[0], "knowledge-update", [moved[2]]),
            q("tr", f"On what date did the user start living in {moved[0]}? Answer YYYY-MM-DD.",
              moved[1].strftime("%Y-%m-%d"), "temporal-reasoning", [moved[2]]),
            q("ms", "In how many different cities has the user lived, counting the current one?",
              str(len({x[0] for x in cities})), "multi-session", [x[2] for x in cities]),
            q("abs", f"What is the user's {rng.choice(NEVER)}?", NOT_MENTIONED, "abstention", []),
        ]
        out.append(conv)
    return out
