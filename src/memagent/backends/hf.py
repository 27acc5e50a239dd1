"""The `transformers` backend: any Hugging Face causal LM (an id or a local path), batched.

Prompts are rendered with the tokenizer's chat template when it has one (or when forced), left
padded, and generated in sub-batches sorted by length. Log-probs of the generated tokens are
computed on request with one teacher-forced forward pass (temperature applied, top_p ignored),
which is exact for the paper's rollout setting (top_p = 1.0) and avoids holding per-step
vocabulary-sized scores. With `speculate="ngram"` rows are decoded one at a time with prompt-lookup
drafts (`memagent.backends.speculate`): the same tokens under greedy and per-row seeded sampling, the same
distribution under plain sampling.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

import torch

from memagent.backends.base import BackendError, Generation, SamplingParams
from memagent.backends.chat import render_prompt, resolve_chat_template
from memagent.backends.gguf import resolve_model
from memagent.backends.lookup_decode import greedy_pick, row_pick, sample_pick, speculative_decode
from memagent.backends.row_sampling import RowSampler, row_uniforms
from memagent.backends.speculate import check_speculate
from memagent.backends.tokenizer import VocabMask, check_vocab, ensure_pad_token, load_tokenizer

log = logging.getLogger(__name__)


def pick_device(device: str = "auto") -> torch.device:
    """cuda if available, else mps, else cpu (for "auto")."""
    if device != "auto":
        return torch.device(device)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def yarn_rope(rope: dict[str, Any] | None, max_positions: int, factor: float) -> tuple[dict[str, Any], int]:
    """RoPE parameters with YaRN scaling by `factor`, and the window they give (Qwen2.5's recipe:
    rope type "yarn", the factor, the trained window as original_max_position_embeddings)."""
    if not factor > 1:
        raise BackendError(f"a YaRN factor must be > 1 (it multiplies the trained window), got {factor}")
    params = {k: v for k, v in (rope or {}).items() if k != "type"}
    params.update(rope_type="yarn", factor=float(factor), original_max_position_embeddings=int(max_positions))
    return params, int(max_positions * factor)


def pick_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """bfloat16 on a GPU that supports it, float32 elsewhere (for "auto")."""
    if dtype != "auto":
        try:
            return {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
                    "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}[dtype]
        except KeyError:
            raise BackendError(f"unknown dtype {dtype!r}; use auto, float32, bfloat16 or float16") from None
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


class TransformersBackend:
    """Backend over an in-memory `transformers` model (see `from_pretrained` to load one).

    use_chat_template: "auto" (use it when the tokenizer has one), True, or False (raw text).
    want_logprobs: fill `Generation.logprobs` (one extra forward pass per batch).
    chat_template_kwargs: extra variables for the chat template, e.g. {"enable_thinking": False}.
    speculate: "none" or "ngram" (prompt-lookup speculative decoding, rows one at a time).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        use_chat_template: bool | str = "auto",
        max_batch_size: int = 64,
        want_logprobs: bool = False,
        max_window: int | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        speculate: str = "none",
        emit_limit: int | None | str = "auto",  # the ids it may emit (`vocab_limit`); "auto": computed here
    ) -> None:
        self.model = model
        try:
            self.speculate = check_speculate(speculate)
        except ValueError as e:
            raise BackendError(str(e)) from None
        if self.speculate != "none":
            check_plain_generation_config(model)
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.tokenizer = ensure_pad_token(tokenizer)
        self.use_chat_template = resolve_chat_template(tokenizer, use_chat_template, self.chat_template_kwargs)
        self.max_batch_size = max_batch_size
        self.want_logprobs = want_logprobs
        cfg = getattr(model, "config", None)
        self.vocab_limit = vocab_limit(model, tokenizer) if emit_limit == "auto" else emit_limit
        self.max_window = max_window or getattr(cfg, "max_position_embeddings", None)
        gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        eos = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
        eos |= set(gen_eos if isinstance(gen_eos, list) else [gen_eos] if gen_eos is not None else [])
        self.eos_ids = sorted(eos)

    @classmethod
    def from_pretrained(
        cls, name: str | Path, *, device: str = "auto", dtype: str = "auto", yarn_factor: float | None = None,
        **kwargs: Any,
    ) -> "TransformersBackend":
        """Load `name`; `yarn_factor` extends the model's window by YaRN rope scaling (e.g. 4.0)."""
        from transformers import AutoConfig, AutoModelForCausalLM  # lazy: transformers

        dev = pick_device(device)
        name = resolve_model(name)  # a GGUF file: its converted folder
        try:
            extra: dict[str, Any] = {}
            config = AutoConfig.from_pretrained(str(name))
            if yarn_factor is not None:
                rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
                params, window = yarn_rope(rope, config.max_position_embeddings, yarn_factor)
                config.rope_parameters = params
                config.max_position_embeddings = window
                extra["config"] = config
        except (OSError, ValueError) as e:
            raise _load_error(name, e) from None
        # the tokenizer first: a folder without its own tokenizer is refused before the weights are read
        tokenizer = load_tokenizer(str(name))
        check_vocab(tokenizer, config_vocab_size(config), str(name))
        try:
            model = AutoModelForCausalLM.from_pretrained(str(name), dtype=pick_dtype(dtype, dev), **extra)
        except (OSError, ValueError, RuntimeError) as e:  # RuntimeError: weights of other shapes than config.json
            raise _load_error(name, e) from None
        model.to(dev).eval()
        return cls(model, tokenizer, **kwargs)

    # -- prompts ---------------------------------------------------------------------------
    def render(self, prompt: str) -> str:
        """The text the model reads for `prompt` (`memagent.backends.chat.render_prompt`)."""
        return render_prompt(self.tokenizer, prompt, self.use_chat_template, self.chat_template_kwargs)

    def encode(self, prompt: str) -> list[int]:
        return self.encode_many([prompt])[0]

    def encode_many(self, prompts: Sequence[str]) -> list[list[int]]:
        """`encode` for many prompts in one tokenizer call (per-prompt calls cost more than the
        tiny demo model's forward pass)."""
        if not prompts:
            return []
        texts = [self.render(p) for p in prompts]
        return [list(ids) for ids in self.tokenizer(texts, add_special_tokens=not self.use_chat_template)["input_ids"]]

    def prompt_length(self, prompt: str) -> int:
        return len(self.encode(prompt))

    # -- generation ------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompts: Sequence[str], params: SamplingParams) -> list[Generation]:
        """One generation per prompt. Sub-batches of rows sorted by length; sub-batch b (from 0) seeded
        params.seed + b. With params.seeds (and temperature > 0), prompt i is sampled with seeds[i] alone
        (`memagent.backends.row_sampling`): its tokens do not depend on the other prompts."""
        if params.seeds is not None and len(params.seeds) != len(prompts):
            raise ValueError(f"SamplingParams.seeds has {len(params.seeds)} seeds for {len(prompts)} prompts")
        encoded = self.encode_many(prompts)
        order = sorted(range(len(prompts)), key=lambda i: len(encoded[i]))
        out: list[Generation | None] = [None] * len(prompts)
        for b in range(0, len(order), self.max_batch_size):
            idx = order[b : b + self.max_batch_size]
            seed = None if params.seed is None else params.seed + b
            rows = None if params.seeds is None or params.greedy else [params.seeds[i] for i in idx]
            run = self._speculate_batch if self.speculate == "ngram" else self._generate_batch
            for i, gen in zip(idx, run([encoded[i] for i in idx], params, seed, rows)):
                out[i] = gen
        return out  # type: ignore[return-value]

    def _generate_batch(
        self, batch: list[list[int]], params: SamplingParams, seed: int | None, row_seeds: list[int] | None = None
    ) -> list[Generation]:
        device = next(self.model.parameters()).device
        pad = self.tokenizer.pad_token_id
        width = max(len(ids) for ids in batch)
        input_ids = torch.full((len(batch), width), pad, dtype=torch.long)  # (B, L)
        attention = torch.zeros((len(batch), width), dtype=torch.long)  # (B, L)
        for r, ids in enumerate(batch):
            input_ids[r, width - len(ids) :] = torch.tensor(ids)
            attention[r, width - len(ids) :] = 1
        kwargs: dict[str, Any] = dict(max_new_tokens=params.max_new_tokens, pad_token_id=pad,
                                      eos_token_id=self.eos_ids or None)
        if row_seeds is not None:  # greedy over the one-hot scores of the per-row sampler
            from transformers import LogitsProcessorList  # lazy: transformers

            sampler = RowSampler(row_uniforms(row_seeds, params.max_new_tokens), params.temperature, params.top_p, width)
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None,
                          logits_processor=LogitsProcessorList([sampler]))
        elif params.greedy:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            kwargs.update(do_sample=True, temperature=params.temperature, top_p=params.top_p, top_k=None)
        if self.vocab_limit is not None:  # ids past the tokenizer have no text: never emit them (check_vocab)
            from transformers import LogitsProcessorList  # lazy: transformers

            kwargs["logits_processor"] = LogitsProcessorList([VocabMask(self.vocab_limit),
                                                              *kwargs.get("logits_processor", [])])
        with torch.random.fork_rng(devices=[] if device.type == "cpu" else [device]):
            if seed is not None:
                torch.manual_seed(seed)
            seq = self.model.generate(input_ids=input_ids.to(device), attention_mask=attention.to(device), **kwargs)
        new = seq[:, width:].tolist()  # (B, T_new)
        results = []
        for r, ids in enumerate(batch):
            toks = new[r]
            finish = "length"
            for t, tok in enumerate(toks):
                if tok in self.eos_ids:
                    toks, finish = toks[: t + 1], "stop"
                    break
            results.append(self._generation(ids, toks, finish))
        return self._with_logprobs(results, params)

    def _speculate_batch(
        self, batch: list[list[int]], params: SamplingParams, seed: int | None, row_seeds: list[int] | None = None
    ) -> list[Generation]:
        """`_generate_batch` by prompt lookup, one row at a time (`memagent.backends.speculate`); row r of a
        sub-batch sampled without per-row seeds draws from a generator seeded seed + r."""
        results = []
        for r, ids in enumerate(batch):
            if row_seeds is not None:
                pick = row_pick(row_uniforms([row_seeds[r]], params.max_new_tokens)[0], params.temperature,
                                params.top_p, self.vocab_limit)
            elif params.greedy:
                pick = greedy_pick(self.vocab_limit)
            else:
                # unseeded: the row's generator is seeded from the global RNG, as plain sampling draws from it
                row_seed = seed + r if seed is not None else int(torch.randint(2**62, (1,)).item())
                gen = torch.Generator().manual_seed(row_seed)
                pick = sample_pick(gen, params.temperature, params.top_p, self.vocab_limit)
            out = speculative_decode(self.model, ids, params.max_new_tokens, pick, self.eos_ids)
            g = self._generation(ids, out.token_ids, out.finish_reason)
            g.draft_proposed, g.draft_accepted = out.proposed, out.accepted
            results.append(g)
        return self._with_logprobs(results, params)

    def _generation(self, prompt_ids: list[int], toks: list[int], finish: str) -> Generation:
        text_ids = toks[:-1] if finish == "stop" else toks
        return Generation(text=self.tokenizer.decode(text_ids, skip_special_tokens=True), token_ids=toks,
                          logprobs=None, prompt_token_ids=list(prompt_ids), finish_reason=finish)

    def _with_logprobs(self, results: list[Generation], params: SamplingParams) -> list[Generation]:
        if self.want_logprobs:
            temperature = 1.0 if params.greedy else params.temperature
            for g, lp in zip(results, self.score([g.prompt_token_ids for g in results],
                                                 [g.token_ids for g in results], temperature)):
                g.logprobs = lp
        return results

    @torch.no_grad()
    def score(self, prompts: list[list[int]], responses: list[list[int]], temperature: float = 1.0) -> list[list[float]]:
        """Log-prob of each response token given its prompt, by one teacher-forced forward pass."""
        device = next(self.model.parameters()).device
        pad = self.tokenizer.pad_token_id
        seqs = [p + r for p, r in zip(prompts, responses)]
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), pad, dtype=torch.long)  # (B, L) right padded
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for r, s in enumerate(seqs):
            ids[r, : len(s)] = torch.tensor(s)
            mask[r, : len(s)] = 1
        logits = self.model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.float()  # (B, L, V)
        if self.vocab_limit is not None:  # the same distribution generation samples from
            logits = logits[..., : self.vocab_limit]
        logp = torch.log_softmax(logits[:, :-1] / temperature, dim=-1)  # (B, L-1, V)
        tok = torch.gather(logp, 2, ids[:, 1:].to(device).unsqueeze(-1)).squeeze(-1)  # (B, L-1)
        out = []
        for r, (p, resp) in enumerate(zip(prompts, responses)):
            out.append(tok[r, len(p) - 1 : len(p) - 1 + len(resp)].tolist())
        return out


# generation_config settings plain `generate` would apply and speculative decoding does not (their neutral values):
# refused, not ignored
_UNSUPPORTED = {"repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0, "no_repeat_ngram_size": 0,
                "min_length": 0, "min_new_tokens": 0, "bad_words_ids": None, "suppress_tokens": None,
                "begin_suppress_tokens": None, "forced_bos_token_id": None, "forced_eos_token_id": None,
                "sequence_bias": None}


def check_plain_generation_config(model: Any) -> None:
    """BackendError when the model's generation_config sets a logits rule that speculation would skip."""
    gc = getattr(model, "generation_config", None)
    bad = [f"{k}={getattr(gc, k, None)!r}" for k, neutral in _UNSUPPORTED.items()
           if getattr(gc, k, None) not in (None, neutral, [], {})]
    if bad:
        raise BackendError(f"--speculate ngram cannot apply the model's generation_config {', '.join(bad)} (it would "
                           "change the output); decode without --speculate")


def config_vocab_size(config: Any) -> Any:
    """`vocab_size` of a model config (of its text part, for configs that nest one); None when it has none."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(text, "vocab_size", getattr(config, "vocab_size", None))


def vocab_limit(model: Any, tokenizer: Any) -> int | None:
    """How many ids the model may emit: len(tokenizer) when the output layer has more rows (an embedding padded
    past the tokenizer, `check_vocab`: those ids have no text), else None (nothing to mask). Generation masks the
    rest (`VocabMask`), scoring and the trainer's log-probs cut the logits to it, so all see one distribution."""
    rows = _embedding_rows(model)
    return len(tokenizer) if rows is not None and rows > len(tokenizer) else None


def _embedding_rows(model: Any) -> int | None:
    """Rows of the model's output layer (its vocabulary as the model sees it), or None when it has none."""
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(out, "weight", None)
    return int(weight.shape[0]) if weight is not None else None


def _load_error(name: str | Path, e: Exception) -> BackendError:
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return BackendError(f"cannot load model {str(name)!r} with transformers: {first}; pass a local directory saved "
                        "with save_pretrained (its config.json matching its weights), or a Hugging Face id "
                        "(which needs network access or a filled cache)")
