"""Sampling seeds of the read-write loop are explicit: the `call`-th model call of a run under seed s gets
s * 1_000_003 + call, whatever the same agent ran before."""
from memagent.agent.workflow import AgentInput, MemoryAgent, call_seed
from memagent.config import AgentConfig

from fakes import ScriptedBackend

CONFIG = dict(chunk_tokens=20, memory_tokens=8, answer_tokens=8, query_tokens=16, temperature=1.0,
              memory_template="Q:{question}|M:{memory}|C:{chunk}|", final_template="Q:{question}|M:{memory}|A:")


def _seeds(agent: MemoryAgent, backend: ScriptedBackend, items: list[AgentInput]) -> list[int | None]:
    before = len(backend.params)
    agent.run(items)
    return [p.seed for p in backend.params[before:]]


def test_a_sample_gets_the_same_seeds_whatever_ran_before_on_the_agent(tiny_tokenizer):
    backend = ScriptedBackend(tiny_tokenizer, lambda prompt, call: "note")
    agent = MemoryAgent(backend, AgentConfig(seed=7, **CONFIG))
    doc = "city river " * 15  # the tiny tokenizer: 30 word tokens + the last space = 31 tokens, 2 chunks of <= 20
    assert len(tiny_tokenizer(doc, add_special_tokens=False)["input_ids"]) == 31
    sample = [AgentInput("q?", doc, "x")]
    # calls 1 and 2 read the two chunks, call 3 answers: 7 * 1_000_003 + 1, 2, 3
    first = _seeds(agent, backend, sample)
    assert first == [7_000_022, 7_000_023, 7_000_024]
    _seeds(agent, backend, [AgentInput("other?", doc * 3, "y"), AgentInput("more?", "short text", "z")])
    assert _seeds(agent, backend, sample) == first  # a hidden call counter gave 7_000_03x here


def test_unseeded_runs_stay_unseeded():
    assert call_seed(None, 5) is None
    assert call_seed(0, 1) == 1 and call_seed(2, 4) == 2_000_010
