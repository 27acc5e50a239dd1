"""The `vllm` backend: the in-process vLLM engine (`vllm.LLM`), with tensor parallelism.

An optional extra (`pip install 'memagent[vllm]'`, Linux + CUDA GPU): `vllm` is imported only when
a `VLLMBackend` is constructed, never by `import memagent.backends`.

Prompts are rendered and tokenised here, with the engine's own tokenizer and chat template (the
same code path as the other backends), and sent as token ids, so `prompt_length` and
`Generation.prompt_token_ids` are exactly what the engine saw. Each prompt of a batch gets its own
seed (seed + index), so equal prompts in a batch (a rollout group) give different samples.
Generated ids come back from the engine, terminating EOS included. Log-probs (`want_logprobs`)
are the sampled tokens' (`SamplingParams(logprobs=0)`); by default vLLM reports those of the raw
model, before temperature: pass `logprobs_mode="processed_logprobs"` (vLLM >= 0.10.2) through
the engine keyword arguments to get the sampling distribution's.
"""
from __future__ import annotations

from typing import Any, Sequence

from memagent.backends.base import BackendError, Generation, SamplingParams
from memagent.backends.chat import encode_prompt, resolve_chat_template

INSTALL_HINT = "the vllm backend needs the optional extra: pip install 'memagent[vllm]' (Linux + CUDA GPU)"


def generation_from_vllm(output: Any, want_logprobs: bool) -> Generation:
    """One `vllm.RequestOutput` (first sample) -> Generation.

    Reads output.prompt_token_ids and output.outputs[0].{text, token_ids, logprobs, finish_reason};
    logprobs is one mapping per generated position, token id -> object with `.logprob`.
    """
    if not output.outputs:
        raise BackendError(f"vLLM returned no completion for request {getattr(output, 'request_id', '?')}")
    comp = output.outputs[0]
    ids = [int(t) for t in comp.token_ids]  # [T_out], EOS included when it stopped on one
    logprobs = None
    if want_logprobs:
        if comp.logprobs is None or len(comp.logprobs) != len(ids):
            raise BackendError(
                f"vLLM returned {0 if comp.logprobs is None else len(comp.logprobs)} log-prob entries "
                f"for {len(ids)} tokens; was the request sent with SamplingParams(logprobs=0)?")
        logprobs = [float(pos[tok].logprob) for pos, tok in zip(comp.logprobs, ids)]  # [T_out]
    prompt_ids = output.prompt_token_ids
    return Generation(
        text=comp.text,
        token_ids=ids,
        logprobs=logprobs,
        prompt_token_ids=[int(t) for t in prompt_ids] if prompt_ids is not None else None,
        finish_reason="length" if comp.finish_reason == "length" else "stop",
    )


class VLLMBackend:
    """Backend over an in-process `vllm.LLM`.

    model: Hugging Face id or local directory. tensor_parallel_size: GPUs the model is split over.
    dtype / gpu_memory_utilization / max_model_len / **engine_kwargs: passed to `vllm.LLM`.
    use_chat_template: "auto" (when the tokenizer has one), True, or False (raw text).
    want_logprobs: fill `Generation.logprobs` (see the module docstring for their meaning).
    chat_template_kwargs: extra variables for the chat template, e.g. {"enable_thinking": False}.
    yarn_factor: extend the window by YaRN rope scaling (the model config's window x factor).
    """

    def __init__(
        self,
        model: str,
        tensor_parallel_size: int = 1,
        dtype: str = "auto",
        gpu_memory_utilization: float = 0.9,  # vLLM's default: the KV cache takes the rest
        max_model_len: int | None = None,  # None: the model config's
        use_chat_template: bool | str = "auto",
        want_logprobs: bool = False,
        chat_template_kwargs: dict[str, Any] | None = None,
        yarn_factor: float | None = None,
        **engine_kwargs: Any,
    ) -> None:
        try:
            import vllm  # lazy: vllm
        except ImportError:
            raise BackendError(INSTALL_HINT) from None
        if tensor_parallel_size < 1:
            raise BackendError(f"tensor_parallel_size must be at least 1, got {tensor_parallel_size}")
        self._vllm = vllm
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        if yarn_factor is not None:
            overrides, window = yarn_overrides(model, yarn_factor)
            engine_kwargs["hf_overrides"] = {**engine_kwargs.get("hf_overrides", {}), **overrides}
            max_model_len = max_model_len or window
        try:
            self.llm = vllm.LLM(model=model, tensor_parallel_size=tensor_parallel_size, dtype=dtype,
                                gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
                                **engine_kwargs)
        except (OSError, ValueError, RuntimeError) as e:
            raise BackendError(
                f"vLLM could not start model {model!r} (tensor_parallel_size={tensor_parallel_size}): {e}\n"
                "Check the model id or path, that enough GPUs are visible, and lower "
                "gpu_memory_utilization or max_model_len if memory ran out."
            ) from e
        self.tokenizer = self.llm.get_tokenizer()
        self.use_chat_template = resolve_chat_template(self.tokenizer, use_chat_template)
        self.want_logprobs = want_logprobs
        self.max_window = _engine_window(self.llm) or max_model_len

    def encode(self, prompt: str) -> list[int]:
        return encode_prompt(self.tokenizer, prompt, self.use_chat_template, self.chat_template_kwargs)

    def prompt_length(self, prompt: str) -> int:
        return len(self.encode(prompt))

    def sampling_params(self, params: SamplingParams, index: int) -> Any:
        """vLLM's SamplingParams for prompt `index` of a batch."""
        return self._vllm.SamplingParams(
            n=1,
            max_tokens=params.max_new_tokens,
            temperature=params.temperature,  # 0 is greedy in vLLM too
            top_p=params.top_p,
            seed=None if params.seed is None else params.seed + index,
            logprobs=0 if self.want_logprobs else None,  # 0: only the sampled token's
        )

    def generate(self, prompts: Sequence[str], params: SamplingParams) -> list[Generation]:
        if not prompts:
            return []
        inputs = [{"prompt_token_ids": self.encode(p)} for p in prompts]
        sampling = [self.sampling_params(params, i) for i in range(len(prompts))]
        outputs = self.llm.generate(inputs, sampling, use_tqdm=False)  # in input order
        return [generation_from_vllm(o, self.want_logprobs) for o in outputs]


def yarn_overrides(model: str, factor: float) -> tuple[dict[str, Any], int]:
    """vLLM `hf_overrides` that turn on YaRN by `factor` for `model`, and the window it gives.

    Both spellings are set: `rope_scaling` (transformers 4) and `rope_parameters` (transformers 5).
    """
    from transformers import AutoConfig  # lazy: transformers

    from memagent.backends.hf import yarn_rope  # lazy: torch

    try:
        config = AutoConfig.from_pretrained(model)
    except (OSError, ValueError) as e:
        raise BackendError(f"cannot read the config of {model!r} to apply the YaRN factor: {e}") from None
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    params, window = yarn_rope(rope, config.max_position_embeddings, factor)
    scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    return {"rope_scaling": scaling, "rope_parameters": params}, window


def _engine_window(llm: Any) -> int | None:
    """The engine's max_model_len (vLLM keeps it on the model config)."""
    try:
        return int(llm.llm_engine.model_config.max_model_len)
    except (AttributeError, TypeError, ValueError):
        return None
