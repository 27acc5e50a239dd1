"""kill -9 during an append and during a memory update: on reopen every acknowledged event is there exactly once,
and each standing question's memory is the one of the last version it saved, with the read state of that version
(advancing on from it gives what `memagent ask` gives over the text)."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

from stream_helpers import ask_reference, random_events, scripted_backend

from memagent.config import AgentConfig
from memagent.streams import Stream

HERE = Path(__file__).resolve().parent
SRC = str(HERE.parents[1] / "src")
QUESTION = "Where does the user live now?"
CONFIG = dict(chunk_tokens=9, memory_tokens=12, answer_tokens=16)

APPENDER = """
import sys
from memagent.streams import Stream
s = Stream.open(sys.argv[1])
i = int(sys.argv[2])
while True:
    e = s.append(f"event {i} " + "word " * (i % 50))
    print(e.id, flush=True)
    i += 1
"""

ADVANCER = """
import sys, time
sys.path[:0] = [sys.argv[2], sys.argv[3]]
from fakes import ScriptedBackend
from stream_helpers import scripted_reply
from memagent.backends.tiny import build_tokenizer
from memagent.config import AgentConfig
from memagent.streams import Stream

def slow(prompt, i):
    time.sleep(0.02)
    return scripted_reply(prompt, i)

s = Stream.open(sys.argv[1])
q = s.standing(%r, ScriptedBackend(build_tokenizer(), slow), AgentConfig(**%r), "m")
for v in q.iter_advance():
    print(v.chunk, flush=True)
"""


def _run_until(script: str, args: list[str], acknowledged: int) -> list[int]:
    """Run `script`, read its acknowledgements (one number a line) until `acknowledged` of them, then SIGKILL it."""
    env = dict(os.environ, PYTHONPATH=SRC, OMP_NUM_THREADS="1")
    p = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, env=env)
    seen: list[int] = []
    try:
        while len(seen) < acknowledged:
            line = p.stdout.readline()
            assert line, "the child ended before it was killed"
            seen.append(int(line))
        os.kill(p.pid, signal.SIGKILL)
        p.wait(30)
    finally:
        p.kill()
        p.stdout.close()
    assert p.returncode == -signal.SIGKILL
    return seen


def test_kill_9_during_appends_loses_no_acknowledged_event_and_repeats_none(tmp_path):
    s = tmp_path / "s.db"
    Stream.create(s).close()
    for round_ in range(3):
        with Stream.open(s) as r:
            start = len(r)
        acked = _run_until(APPENDER, [str(s), str(start)], 150)
        with Stream.open(s) as r:
            events = r.events()
        assert [e.id for e in events] == list(range(1, len(events) + 1))  # each once, in order, no gap
        assert [e.text.split()[1] for e in events] == [str(i) for i in range(len(events))]
        assert len(events) >= acked[-1] == start + 150
    with Stream.open(s) as r:  # the dead writer's lock went with it
        r.append("after")


def test_kill_9_during_a_memory_update_leaves_the_question_consistent(tmp_path, tiny_tokenizer):
    s = tmp_path / "s.db"
    config = AgentConfig(**CONFIG)
    with Stream.create(s) as w:
        w.append_many(random_events(random.Random(4), 60))
        w.standing(QUESTION, scripted_backend(tiny_tokenizer), config, "m")  # registered, nothing read
    acked = _run_until(ADVANCER % (QUESTION, CONFIG), [str(s), str(HERE.parent), str(HERE)], 5)
    with Stream.open(s) as r:
        q = r.questions()[0]
        versions = r.memories(q["id"])
        assert [v["chunk"] for v in versions] == list(range(len(versions))) and len(versions) >= acked[-1] + 1
        assert q["chunks"] == len(versions) and q["memory"] == versions[-1]["memory"]
        assert q["events_read"] == versions[-1]["events_read"]
        backend = scripted_backend(tiny_tokenizer)
        answer = r.standing(QUESTION, backend, config, "m").answer()  # goes on from the last saved version
        records, ref = ask_reference(scripted_backend(tiny_tokenizer), config, r.text(), QUESTION)
        after = r.memories(q["id"])
    assert [v["memory"] for v in after] == [x["memory"] for x in records[:len(after)]]
    assert after[:len(versions)] == versions  # the versions saved before the kill are kept as they were
    assert (answer.answer, answer.memory) == (ref.answer, ref.memory)
