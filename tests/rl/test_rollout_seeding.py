"""rollout.seeding "sample": each rollout's draws depend on (seed, step, round, its global identity, call) only.

The per-row sampler (memagent.backends.row_sampling) by hand, the transformers backend's per-prompt seeds
(batch neighbours, padding, sub-batching), the scheduler's keyed seeds, and rollouts that come out the same
alone, in a batch, or on rank 1 of 2.
"""
import math

import pytest
import torch

from memagent.backends.base import SamplingParams
from memagent.backends.row_sampling import RowSampler, row_uniforms, sample_rows

LOGP = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4]]))  # (1, 4): cdf 0.1, 0.3, 0.6, 1.0


def pick(u, temperature=1.0, top_p=1.0, scores=LOGP):
    return int(sample_rows(scores, torch.tensor([u], dtype=torch.float64), temperature, top_p)[0])


def test_inverse_cdf_by_hand():
    # probabilities .1 .2 .3 .4: token k is picked for u in [cdf[k-1], cdf[k])
    assert [pick(u) for u in (0.05, 0.25, 0.29, 0.31, 0.59, 0.61, 0.999)] == [0, 1, 1, 2, 2, 3, 3]
    # temperature 0.5 squares the probabilities: .01 .04 .09 .16 / .30 -> cdf .033 .167 .467 1
    assert [pick(u, temperature=0.5) for u in (0.03, 0.1, 0.3, 0.5)] == [0, 1, 2, 3]
    # top_p 0.5: the nucleus is {3 (.4), 2 (.3)} (mass before token 2 is .4 < .5), renormalised to 3/7, 4/7
    assert [pick(u, top_p=0.5) for u in (0.01, 0.42, 0.43, 0.99)] == [2, 2, 3, 3]
    # top_p 0.4: token 3 alone (mass before token 2 is .4, not < .4)
    assert {pick(u, top_p=0.4) for u in (0.0, 0.5, 0.999)} == {3}
    # an excluded token (-inf, e.g. suppressed by another processor) is never picked
    masked = torch.tensor([[0.0, float("-inf"), 0.0]])
    assert [pick(u, scores=masked) for u in (0.49, 0.5, 0.51)] == [0, 2, 2]


def test_draws_follow_the_distribution():
    u = row_uniforms([7], 4000)[0]  # (4000,)
    picks = sample_rows(LOGP.expand(4000, 4), u, 1.0, 1.0)
    freq = torch.bincount(picks, minlength=4).double() / 4000
    assert torch.allclose(freq, torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64), atol=0.03), freq


def test_row_uniforms_are_each_rows_own_stream():
    u = row_uniforms([3, 9, 3], 5)  # (3, 5)
    assert torch.equal(u[0], torch.rand(5, generator=torch.Generator().manual_seed(3), dtype=torch.float64))
    assert torch.equal(u[0], u[2]) and not torch.equal(u[0], u[1])
    assert torch.equal(row_uniforms([9], 5)[0], u[1])  # a row's draws do not depend on the other rows
    assert torch.equal(row_uniforms([2**63 - 1], 2), row_uniforms([2**63 - 1], 2))  # 63-bit seeds work


def test_row_sampler_reads_the_decode_position_and_returns_a_one_hot():
    uniforms = torch.tensor([[0.05, 0.95], [0.95, 0.05]], dtype=torch.float64)  # (B=2, T=2)
    sampler = RowSampler(uniforms, 1.0, 1.0, width=3)
    scores = LOGP.expand(2, 4)
    step0 = sampler(torch.zeros(2, 3, dtype=torch.long), scores)  # input length 3 = width: position 0
    step1 = sampler(torch.zeros(2, 4, dtype=torch.long), scores)  # position 1
    assert step0.argmax(-1).tolist() == [0, 3] and step1.argmax(-1).tolist() == [3, 0]
    assert (step0 == 0).sum() == 2 and torch.isinf(step0).sum() == 6


# -- the transformers backend ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def backend64(tiny_model_dir):
    """The tiny model in float64 (logits that do not move with the batch beyond rounding)."""
    from transformers import AutoModelForCausalLM

    from memagent.backends.hf import TransformersBackend
    from memagent.backends.tokenizer import load_tokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64).eval()
    return TransformersBackend(model, load_tokenizer(str(tiny_model_dir)))


PROMPTS = ["the key", "a longer prompt about the river, the city and the value of the key", "memory value", "x"]


def test_per_prompt_seeds_do_not_depend_on_the_batch(backend64):
    p = SamplingParams(max_new_tokens=10, temperature=1.0, seeds=(11, 12, 13, 14))
    together = [g.token_ids for g in backend64.generate(PROMPTS, p)]
    alone = [backend64.generate([x], SamplingParams(10, 1.0, seeds=(s,)))[0].token_ids for x, s in zip(PROMPTS, p.seeds)]
    reversed_ = [g.token_ids for g in backend64.generate(PROMPTS[::-1], SamplingParams(10, 1.0, seeds=p.seeds[::-1]))]
    backend64.max_batch_size = 1  # one prompt per sub-batch: other sub-batch seeds in the default path
    try:
        split = [g.token_ids for g in backend64.generate(PROMPTS, p)]
    finally:
        backend64.max_batch_size = 64
    assert together == alone == reversed_[::-1] == split
    assert len({tuple(t) for t in together}) == 4 and all(len(t) > 0 for t in together)
    # another seed draws other tokens; equal prompts with different seeds differ
    other = backend64.generate(PROMPTS, SamplingParams(10, 1.0, seeds=(21, 22, 23, 24)))
    assert [g.token_ids for g in other] != together
    twins = backend64.generate(["the key"] * 2, SamplingParams(10, 1.0, seeds=(1, 2)))
    assert twins[0].token_ids != twins[1].token_ids
    with pytest.raises(ValueError, match="2 seeds for 4 prompts"):
        backend64.generate(PROMPTS, SamplingParams(10, 1.0, seeds=(1, 2)))


def test_greedy_and_the_default_path_are_unchanged(backend64):
    greedy = backend64.generate(PROMPTS, SamplingParams(6))
    assert [g.token_ids for g in backend64.generate(PROMPTS, SamplingParams(6, seeds=(1, 2, 3, 4)))] == \
        [g.token_ids for g in greedy]  # seeds ignored when greedy
    # the default sampled path is transformers' own multinomial under torch.manual_seed(seed + sub-batch)
    ids = backend64.encode_many(["memory value"])[0]
    got = backend64.generate(["memory value"], SamplingParams(8, 1.0, seed=5))[0]
    torch.manual_seed(5)
    seq = backend64.model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                   do_sample=True, temperature=1.0, top_p=1.0, top_k=None, max_new_tokens=8,
                                   pad_token_id=backend64.tokenizer.pad_token_id, eos_token_id=backend64.eos_ids)
    want = seq[0, len(ids):].tolist()
    assert got.token_ids == want[: len(got.token_ids)]


# -- the scheduler's keyed seeds ----------------------------------------------------------------------


def test_keyed_call_seeds():
    from memagent.agent.scheduler import batch_seeds, doc_call_seed, keyed_call_seed

    seeds = {keyed_call_seed(5, key, k) for key in range(200) for k in range(1, 10)}
    assert len(seeds) == 1800 and all(0 <= s < 2**63 for s in seeds)  # no repeats, unlike key + k
    assert doc_call_seed(5, 3, 2) == doc_call_seed(5, 4, 1)  # the unkeyed rule repeats: why keys are hashed
    assert keyed_call_seed(None, 1, 1) is None and keyed_call_seed(5, 1, 1) != keyed_call_seed(6, 1, 1)

    class D:
        def __init__(self, pos, calls, seed_key=None):
            self.pos, self.calls, self.seed_key = pos, calls, seed_key

    assert batch_seeds(5, [D(0, 0), D(1, 3)]) is None  # no keys: the default, one seed per batch
    assert batch_seeds(5, [D(0, 0, 40), D(1, 3, 7)]) == (keyed_call_seed(5, 40, 1), keyed_call_seed(5, 7, 4))
    assert batch_seeds(None, [D(0, 0, 40)]) is None


def test_lockstep_batches_carry_each_documents_keyed_seed(tiny_backend):
    from memagent.agent.scheduler import keyed_call_seed
    from memagent.agent.workflow import AgentInput, MemoryAgent
    from memagent.config import AgentConfig

    seen = []

    class Recording:
        tokenizer, max_window = tiny_backend.tokenizer, tiny_backend.max_window

        def prompt_length(self, prompt):
            return tiny_backend.prompt_length(prompt)

        def generate(self, prompts, params):
            seen.append(params.seeds)
            return tiny_backend.generate(prompts, params)

    cfg = AgentConfig(chunk_tokens=8, memory_tokens=2, answer_tokens=2, temperature=1.0, seed=9)
    docs = ["one two three four five six seven eight nine ten eleven", "short text"]
    items = [AgentInput("what?", d, seed_key=key) for d, key in zip(docs, (100, 7))]
    results = MemoryAgent(Recording(), cfg).run(items)
    n_long, n_short = (r.num_chunks for r in results)
    assert n_long > n_short >= 1
    # batch 1: both first memory calls; then each document's k-th call (k = 2 .. chunks + 1) seeded by its key
    assert seen[0] == (keyed_call_seed(9, 100, 1), keyed_call_seed(9, 7, 1))
    assert sorted(s for batch in seen for s in batch) == sorted(
        [keyed_call_seed(9, 100, k) for k in range(1, n_long + 2)] + [keyed_call_seed(9, 7, k) for k in range(1, n_short + 2)])
    seen.clear()
    MemoryAgent(Recording(), cfg).run([AgentInput("what?", d) for d in docs])
    assert seen and all(s is None for s in seen)  # no keys: the default path


# -- rollouts ------------------------------------------------------------------------------------------


def questions(n):
    from memagent.rl.samples import QASample

    return [QASample(f"q{i}", f"what is key {i}?", f"the key {i} is {i * 3}. the sky is blue and the city old.",
                     (str(i * 3),)) for i in range(n)]


def rows_by_sample(batch, group_size):
    """{(group id, g): (response ids of its rows...)}"""
    out = {}
    for s in range(batch.num_samples):
        rows = [n for n in range(batch.num_rows) if int(batch.sample_index[n]) == s]
        out[(int(batch.sample_group[s]), s % group_size)] = tuple(tuple(batch.response_ids[n]) for n in rows)
    return out


def reward(prediction, golds):
    return float(len(prediction or "") % 2)


def test_generate_rollouts_alone_or_in_a_batch(backend64):
    from memagent.config import AgentConfig
    from memagent.rl.rollout import generate_rollouts

    agent = AgentConfig(chunk_tokens=8, memory_tokens=3, answer_tokens=3, temperature=1.0)
    qs = questions(3)
    batch = generate_rollouts(backend64, agent, qs, [10, 11, 12], 3, reward, seed=4, per_sample=True)
    alone = generate_rollouts(backend64, agent, qs[1:2], [11], 3, reward, seed=4, per_sample=True)
    together, single = rows_by_sample(batch, 3), rows_by_sample(alone, 3)
    assert all(together[k] == v for k, v in single.items()) and len(single) == 3
    assert len(set(together.values())) == 9  # every rollout its own draws
    default = rows_by_sample(generate_rollouts(backend64, agent, qs[1:2], [11], 3, reward, seed=4), 3)
    assert default != single  # the default (rank) seeding draws others


@pytest.mark.parametrize("seeding", ["sample", "rank"])
def test_rank_one_of_two_draws_what_one_process_draws(backend64, monkeypatch, seeding):
    """collect_rollouts on rank 1 of 2 (collectives stubbed to this rank alone) against one process."""
    import memagent.rl.rollout as ro
    from memagent.rl.config import load_config
    from memagent.rl.distributed import DistInfo
    from memagent.rl.recipe import DataStream

    cfg = load_config(None, ["rollout.batch_size=4", "rollout.group_size=2", "update.mini_batch_size=2",
                             "agent.chunk_tokens=8", "agent.memory_tokens=3", "agent.answer_tokens=3",
                             f"rollout.seeding={seeding}", "seed=3"])
    qs = questions(8)
    one = ro.collect_rollouts(backend64, cfg, qs, DataStream(8, 3, position=4), reward, step=2, info=DistInfo())
    monkeypatch.setattr(ro, "all_gather_objects", lambda obj, info: [obj])
    monkeypatch.setattr(ro, "all_reduce", lambda t, info, op="sum": t)
    two = ro.collect_rollouts(backend64, cfg, qs, DataStream(8, 3, position=4), reward, step=2,
                              info=DistInfo(rank=1, world_size=2))
    full, mine = rows_by_sample(one.batch, 2), rows_by_sample(two.batch, 2)
    assert sorted({g for g, _ in mine}) == [5, 7]  # positions 1 and 3 of the round (mini-batches of 2)
    same = all(full[k] == v for k, v in mine.items())
    assert same is (seeding == "sample")
    if seeding == "sample":  # the same rewards, hence the same group advantages
        def adv(b):
            return {(int(g), s % 2): a for s, (g, a) in enumerate(zip(b.sample_group, b.sample_advantages.tolist()))}

        full_adv = adv(one.batch)
        assert all(math.isclose(a, full_adv[k]) for k, a in adv(two.batch).items())


def test_config_and_resume_warning(caplog):
    from memagent.config import ConfigError
    from memagent.rl.config import load_config
    from memagent.rl.distributed import DistInfo
    from memagent.rl.rollout import warn_rank_seeded_resume

    assert load_config(None, []).rollout.seeding == "rank"
    with pytest.raises(ConfigError, match="rollout.seeding must be 'rank' or 'sample'"):
        load_config(None, ["rollout.seeding=batch"])
    with pytest.raises(ConfigError, match="engine 'policy' only"):
        load_config(None, ["rollout.seeding=sample", "rollout.engine=vllm", "model=m"])
    msg = warn_rank_seeded_resume("rank", 2, DistInfo())
    assert "saved by 2 process(es) with 1" in msg and "rollout.seeding: sample" in msg and msg in caplog.text
    assert warn_rank_seeded_resume("sample", 2, DistInfo()) is None
    assert warn_rank_seeded_resume("rank", 2, DistInfo(rank=1, world_size=2)) is None
    assert warn_rank_seeded_resume("rank", None, DistInfo()) is None
