"""The long-term-memory benchmarks' released files read as conversations: events (text, role, time, source) and
questions (gold answers, the ability tested, evidence), which `memagent.streams.samples` writes as stream files and
sample JSONL (`memagent data import --format longmemeval|locomo|memoryagentbench FILE`).

- LongMemEval (`longmemeval_s.json`, `_m`, `_oracle`): a JSON array; each item is one question over its own
  haystack: `haystack_sessions` (lists of turns {role, content, has_answer?}) with `haystack_session_ids` and
  `haystack_dates` ("2023/05/20 (Sat) 02:21"), `question`, `answer`, `question_type`, `question_date`,
  `answer_session_ids`; an id ending in `_abs` is an abstention question. Evidence: the turns marked has_answer.
- LoCoMo (`locomo10.json`): a JSON array of conversations: `conversation` {speaker_a, speaker_b, session_N: [turns
  {speaker, dia_id, text, blip_caption?}], session_N_date_time: "1:56 pm on 8 May, 2023"} and `qa` [{question,
  answer | adversarial_answer, evidence: [dia_id], category}]. Categories 1-4: multi-hop, temporal, open-domain,
  single-hop; 5: adversarial (the answer is not in the conversation: gold "not mentioned").
- MemoryAgentBench: rows of one `context` and many `questions` with `answers` (each a string or a list of
  alternatives) and `metadata` {source?}; a JSON array or JSONL. The context becomes events of its paragraphs (at
  most `PIECE_CHARS` each), role `document`, all at `UNDATED` (the rows carry no time).

Scores: rule-based (`sub_em` for LongMemEval and MemoryAgentBench, token `f1` for LoCoMo, as their papers' rule-based
columns); the LLM-judged ones are the judge reward's when a judge model is named. A file that is not what its format
says is one StreamError naming the item and the field.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

from memagent.streams.events import ROLE, StreamError

FORMATS = ("longmemeval", "locomo", "memoryagentbench")
UNDATED = "2000-01-01T00:00:00Z"  # the time of events whose file has none (MemoryAgentBench)
PIECE_CHARS = 4000  # the most characters of one event made from a MemoryAgentBench context
LONGMEMEVAL_ABILITY = {"single-session-user": "information-extraction",
                       "single-session-assistant": "information-extraction",
                       "single-session-preference": "information-extraction", "multi-session": "multi-session",
                       "knowledge-update": "knowledge-update", "temporal-reasoning": "temporal-reasoning"}
LOCOMO_ABILITY = {1: "multi-hop", 2: "temporal-reasoning", 3: "open-domain", 4: "single-hop", 5: "abstention"}
NOT_MENTIONED = "not mentioned"


@dataclass
class Conversation:
    """One stream's worth of a benchmark: its events in order and the questions over it."""

    id: str
    events: list[dict[str, Any]] = field(default_factory=list)  # {text, role, time, source}
    questions: list[dict[str, Any]] = field(default_factory=list)  # {id, question, answers, ability, evidence, ...}


def read_conversations(path: str | Path, fmt: str) -> Iterator[Conversation]:
    """The conversations of the benchmark file `path` in format `fmt` (FORMATS)."""
    readers = {"longmemeval": _longmemeval, "locomo": _locomo, "memoryagentbench": _memoryagentbench}
    if fmt not in readers:
        raise StreamError(f"unknown benchmark format {fmt!r}; the formats are {', '.join(FORMATS)}")
    path = Path(path)
    if not path.is_file():
        raise StreamError(f"{path}: no such file")
    yield from readers[fmt](path, _load(path, fmt))


def _load(path: Path, fmt: str) -> list[Any]:
    text = path.read_text(encoding="utf-8")
    try:
        if fmt == "memoryagentbench" and not text.lstrip().startswith("["):
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise StreamError(f"{path} is not {fmt} JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    if not isinstance(data, list):
        raise StreamError(f"{path}: a {fmt} file is a JSON array of items, got a {type(data).__name__}")
    return data


def _need(item: Any, key: str, kind: type | tuple, where: str) -> Any:
    if not isinstance(item, dict):
        raise StreamError(f"{where} is a {type(item).__name__}, not an object")
    if key not in item:
        raise StreamError(f"{where} lacks the field {key!r}")
    value = item[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        want = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise StreamError(f"{where}: {key} must be {want}, got {type(value).__name__}")
    return value


def _role(name: Any) -> str:
    role = re.sub(r"[^A-Za-z0-9_.\-]+", "_", str(name)).strip("_")[:32] or "speaker"
    assert ROLE.fullmatch(role)
    return role


def _longmemeval_time(text: Any, where: str) -> str:
    m = re.fullmatch(r"\s*(\d{4})/(\d{1,2})/(\d{1,2})(?:\s*\(\w+\))?\s*(\d{1,2}):(\d{2})\s*", str(text))
    if m is None:
        raise StreamError(f"{where}: bad date {str(text)[:40]!r}; LongMemEval writes 2023/05/20 (Sat) 02:21")
    y, mo, d, h, mi = map(int, m.groups())
    try:
        return datetime(y, mo, d, h, mi).strftime("%Y-%m-%dT%H:%M:00Z")
    except ValueError:
        raise StreamError(f"{where}: bad date {text!r}") from None


def _longmemeval(path: Path, items: list[Any]) -> Iterator[Conversation]:
    for i, item in enumerate(items):
        where = f"{path} item {i}"
        qid = str(_need(item, "question_id", (str, int), where))
        sessions = _need(item, "haystack_sessions", list, where)
        sids = _need(item, "haystack_session_ids", list, where)
        dates = _need(item, "haystack_dates", list, where)
        if not len(sessions) == len(sids) == len(dates):
            raise StreamError(f"{where}: haystack_sessions, haystack_session_ids and haystack_dates differ in length")
        conv, evidence = Conversation(qid), []
        for s, (session, sid, date) in enumerate(zip(sessions, sids, dates)):
            time = _longmemeval_time(date, f"{where} haystack_dates[{s}]")
            if not isinstance(session, list):
                raise StreamError(f"{where} haystack_sessions[{s}] is not a list of turns")
            for t, turn in enumerate(session):
                at = f"{where} haystack_sessions[{s}][{t}]"
                text = _need(turn, "content", str, at)
                if not text.strip():
                    continue
                conv.events.append(dict(text=text, role=_role(_need(turn, "role", str, at)), time=time,
                                        source=f"session {sid}"[:200]))
                if turn.get("has_answer"):
                    evidence.append(text.strip())
        qtype = str(_need(item, "question_type", str, where))
        abstain = qid.endswith("_abs")
        answer = item.get("answer")
        if answer is None or isinstance(answer, (dict, list)):
            raise StreamError(f"{where}: answer must be text or a number")
        question = _need(item, "question", str, where)
        if item.get("question_date"):
            question = f"{question}\n(Today is {item['question_date']}.)"
        conv.questions.append(dict(id=qid, question=question, answers=[str(answer)], metric="sub_em",
                                   task=f"longmemeval/{qtype}", ability="abstention" if abstain else
                                   LONGMEMEVAL_ABILITY.get(qtype, qtype), abstention=abstain, evidence=evidence,
                                   evidence_ids=[str(x) for x in item.get("answer_session_ids") or []]))
        yield conv


def _locomo_time(text: Any, where: str) -> str:
    try:
        t = datetime.strptime(re.sub(r"\s+", " ", str(text).strip()), "%I:%M %p on %d %B, %Y")
    except ValueError:
        raise StreamError(f"{where}: bad date {str(text)[:40]!r}; LoCoMo writes 1:56 pm on 8 May, 2023") from None
    return t.strftime("%Y-%m-%dT%H:%M:00Z")


def _locomo(path: Path, items: list[Any]) -> Iterator[Conversation]:
    for i, item in enumerate(items):
        where = f"{path} item {i}"
        conv = Conversation(str(item.get("sample_id", i)) if isinstance(item, dict) else str(i))
        c = _need(item, "conversation", dict, where)
        numbers = sorted(int(m.group(1)) for k in c if (m := re.fullmatch(r"session_(\d+)", k)))
        texts: dict[str, str] = {}
        for n in numbers:
            time = _locomo_time(_need(c, f"session_{n}_date_time", str, f"{where} conversation"),
                                f"{where} session_{n}_date_time")
            for t, turn in enumerate(_need(c, f"session_{n}", list, f"{where} conversation")):
                at = f"{where} session_{n}[{t}]"
                text = _need(turn, "text", str, at)
                if turn.get("blip_caption"):
                    text = f"{text} [shares a photo: {turn['blip_caption']}]"
                if not text.strip():
                    continue
                dia = str(turn.get("dia_id", f"D{n}:{t + 1}"))
                texts[dia] = text.strip()
                conv.events.append(dict(text=text, role=_role(_need(turn, "speaker", str, at)), time=time,
                                        source=dia[:200]))
        for q, qa in enumerate(_need(item, "qa", list, where)):
            at = f"{where} qa[{q}]"
            category = qa.get("category") if isinstance(qa, dict) else None
            abstain = category == 5
            if abstain:
                answers = [NOT_MENTIONED]
            else:
                answer = _need(qa, "answer", (str, int, float), at)
                answers = [str(answer)]
            ids = [str(x) for x in qa.get("evidence") or []]
            conv.questions.append(dict(id=f"{conv.id}-q{q}", question=_need(qa, "question", str, at), answers=answers,
                                       metric="f1", task=f"locomo/{LOCOMO_ABILITY.get(category, category)}",
                                       ability=LOCOMO_ABILITY.get(category, str(category)), abstention=abstain,
                                       evidence=[texts[x] for x in ids if x in texts], evidence_ids=ids))
        yield conv


def _pieces(context: str) -> Iterator[str]:
    """A context's paragraphs packed into events of at most PIECE_CHARS characters (a longer paragraph is cut)."""
    piece = ""
    for para in re.split(r"\n\s*\n", context):
        para = para.strip()
        while len(para) > PIECE_CHARS:
            if piece:
                yield piece
                piece = ""
            yield para[:PIECE_CHARS]
            para = para[PIECE_CHARS:].strip()
        if piece and len(piece) + 2 + len(para) > PIECE_CHARS:
            yield piece
            piece = ""
        if para:
            piece = f"{piece}\n\n{para}" if piece else para
    if piece:
        yield piece


def _memoryagentbench(path: Path, rows: list[Any]) -> Iterator[Conversation]:
    for i, row in enumerate(rows):
        where = f"{path} row {i}"
        context = _need(row, "context", str, where)
        questions = _need(row, "questions", list, where)
        answers = _need(row, "answers", list, where)
        if len(questions) != len(answers):
            raise StreamError(f"{where}: {len(questions)} questions but {len(answers)} answers")
        meta = row.get("metadata") if isinstance(row.get("metadata"), dict) else {}
        source = str(meta.get("source") or "memoryagentbench")[:200]
        conv = Conversation(str(row.get("id", i)))
        conv.events = [dict(text=p, role="document", time=UNDATED, source=source) for p in _pieces(context)]
        for q, (question, gold) in enumerate(zip(questions, answers)):
            gold = gold if isinstance(gold, list) else [gold]
            if not isinstance(question, str) or not gold or not all(isinstance(g, (str, int, float)) for g in gold):
                raise StreamError(f"{where}: questions[{q}] must be text with answers (text or a list of text)")
            conv.questions.append(dict(id=f"{conv.id}-q{q}", question=question, answers=[str(g) for g in gold],
                                       metric="sub_em", task=f"memoryagentbench/{source}", ability=source,
                                       abstention=False, evidence=[], evidence_ids=[]))
        yield conv
