"""The GPU paths of training, run on the tiny model: one line PASS / FAIL / SKIP per path.

    vllm_weight_push   rollout.engine=vllm: the engine starts (version check, worker extension),
                       generates, and after a change of the trained weights `sync` pushes them
                       (collective_rpc + load_weights in chunks): the workers' parameter sum follows.
    vllm_sleep_wake    vllm.sleep: `offload` frees GPU memory, `sync` wakes the engine, pushes, and
                       the engine generates again.
    vllm_lora_push     a LoRA policy (peft, adapters made non-zero) on the same engine: `sync` pushes the merged
                       weights under the base names (rl/lora.merged_weights); the workers' sum moves by the
                       merged-minus-base sum, and the engine generates.
    flash_attn_varlen  two rows packed into one sequence with position ids restarting per row give
                       the logits of the rows run apart (transformers' flash_attention_2 varlen path,
                       which padding-free packing relies on).
    nccl_broadcast     the vllm-server weight broadcast (`ServerWeights` -> `WeightReceiver`) between
                       two processes over NCCL; needs two GPUs (NCCL refuses two ranks on one).
Run through scripts/gpu_check.sh; exit status 1 when a path fails, 2 without a GPU.
"""
from __future__ import annotations

import multiprocessing as mp
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

RESULTS: list[tuple[str, str, str]] = []


class Skip(Exception):
    """A path that cannot run here (the reason is printed)."""


def check(name: str, fn: Callable[[], str | None]) -> None:
    t0 = time.perf_counter()
    try:
        note = fn() or ""
        status = "PASS"
    except Skip as e:
        status, note = "SKIP", str(e)
    except Exception as e:  # noqa: BLE001 -- every failure is reported, then the next path runs
        status, note = "FAIL", f"{type(e).__name__}: {e}"
        traceback.print_exc()
    RESULTS.append((name, status, note))
    print(f"{status} {name} ({time.perf_counter() - t0:.1f} s) {note}", flush=True)


def tiny_dir() -> Path:
    """The tiny model in bfloat16 (what vLLM's attention kernels and training on a GPU use)."""
    from transformers import AutoModelForCausalLM

    from memagent.backends.tiny import build_tiny_model

    path = build_tiny_model(Path(tempfile.mkdtemp(prefix="gpu_check_")) / "tiny", seed=0)
    AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).save_pretrained(path)
    return path


def param_sum(model: torch.nn.Module) -> float:
    return float(sum(p.detach().double().sum().item() for p in model.parameters()))


def make_engine(model_dir: Path, sleep: bool = True) -> tuple[Any, torch.nn.Module]:
    from transformers import AutoModelForCausalLM

    from memagent.backends.tokenizer import load_tokenizer
    from memagent.rl.config import load_config
    from memagent.rl.distributed import DistInfo
    from memagent.rl.vllm.engine import VLLMRollout

    cfg = load_config(None, [f"model={model_dir}", "rollout.engine=vllm", f"vllm.sleep={str(sleep).lower()}",
                             "vllm.gpu_memory_utilization=0.2", "vllm.sync_chunk_mb=1", "progress=false"])
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda()
    return VLLMRollout(model, load_tokenizer(str(model_dir)), cfg, DistInfo(device=torch.device("cuda"))), model


def generate_once(engine: Any) -> str:
    from memagent.backends.base import SamplingParams

    gen = engine.backend().generate(["the key is"], SamplingParams(max_new_tokens=8, temperature=0.0))
    return gen[0].text


def engine_sum(engine: Any) -> float:
    return float(engine.llm.collective_rpc("memagent_checksum")[0])


def push_and_compare(engine: Any, model: torch.nn.Module, before_sync: Callable[[], str] = lambda: "") -> str:
    """Change every trained weight, run `before_sync` (e.g. the offload), sync, and compare the change
    of the parameter sums (vLLM's padded vocabulary rows are not model weights: only changes compare)."""
    trained0, engine0 = param_sum(model), engine_sum(engine)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    want = param_sum(model) - trained0  # bf16 both sides: the push copies exactly these values
    note = before_sync()
    engine.sync()
    got = engine_sum(engine) - engine0
    if abs(got - want) > 1e-4 * max(1.0, abs(want)):
        raise AssertionError(f"engine parameter sum changed by {got:.6f}, the trained one by {want:.6f}")
    return f"{note}sum change {got:.4f} == trained {want:.4f}"


def vllm_weight_push(engine: Any, model: torch.nn.Module) -> str:
    generate_once(engine)
    return push_and_compare(engine, model) + f"; generates: {generate_once(engine)!r}"


def vllm_sleep_wake(engine: Any, model: torch.nn.Module) -> str:
    generate_once(engine)

    def offload() -> str:
        torch.cuda.synchronize()
        free_before = torch.cuda.mem_get_info()[0]
        engine.offload()
        torch.cuda.synchronize()
        freed = torch.cuda.mem_get_info()[0] - free_before
        if freed <= 0 or not engine.asleep:
            raise AssertionError(f"sleep freed no GPU memory ({freed} bytes)")
        return f"sleep freed {freed / 2**20:.0f} MiB; "

    note = push_and_compare(engine, model, offload)
    return f"{note}; generates: {generate_once(engine)!r}"


def state_sum(named: Any) -> float:
    return float(sum(t.detach().double().sum().item() for _, t in named))


def vllm_lora_push(engine: Any, model: torch.nn.Module) -> str:
    try:
        import peft  # noqa: F401
    except ImportError:
        raise Skip("peft is not installed (pip install 'memagent[lora]')") from None
    from memagent.rl.lora import apply_lora
    from memagent.rl.scale_config import LoraConfig
    from memagent.rl.vllm.engine import trained_weights

    base = state_sum(trained_weights(model))
    lora = apply_lora(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]), engine="vllm")
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.05)
    want = state_sum(trained_weights(lora)) - base
    engine.model, engine0 = lora, engine_sum(engine)
    engine.sync()
    got = engine_sum(engine) - engine0
    if abs(got - want) > 1e-3 * max(1.0, abs(want)):
        raise AssertionError(f"engine parameter sum changed by {got:.6f}, merged - base by {want:.6f}")
    return f"sum change {got:.4f} == merged - base {want:.4f}; generates: {generate_once(engine)!r}"


def flash_attn_varlen(model_dir: Path) -> str:
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        raise Skip("flash-attn is not installed (pip install flash-attn)") from None
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16,
                                                 attn_implementation="flash_attention_2").cuda().eval()
    a, b = torch.randint(3, 200, (1, 11)).cuda(), torch.randint(3, 200, (1, 7)).cuda()
    with torch.no_grad():
        apart = torch.cat([model(a).logits, model(b).logits], dim=1).float()
        pos = torch.cat([torch.arange(11), torch.arange(7)]).unsqueeze(0).cuda()
        packed = model(torch.cat([a, b], dim=1), position_ids=pos).logits.float()
    diff = float((apart - packed).abs().max())
    if diff > 2e-2:
        raise AssertionError(f"packed logits differ from the rows run apart by {diff:.4g} (bf16)")
    return f"max |packed - apart| = {diff:.3g} (bf16)"


def _receiver(conn: Any, model_dir: str) -> None:
    """The server side on cuda:1: a WeightReceiver over a transformers model, driven through a pipe."""
    import types

    from transformers import AutoModelForCausalLM

    from memagent.rl.vllm.worker import WeightReceiver

    class Loading:
        def __init__(self, model: Any) -> None:
            self.model = model

        def load_weights(self, weights: Any) -> None:
            self.model.load_state_dict(dict(weights), strict=False)

        def parameters(self) -> Any:
            return self.model.parameters()

    torch.cuda.set_device(1)
    worker = WeightReceiver()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda(1)
    worker.model_runner = types.SimpleNamespace(model=Loading(model))
    worker.device, worker.rank = torch.device("cuda:1"), 0
    while True:
        method, args = conn.recv()
        if method is None:
            return
        conn.send(getattr(worker, method)(*args))


def nccl_broadcast(model_dir: Path) -> str:
    if torch.cuda.device_count() < 2:
        raise Skip("needs 2 GPUs: NCCL refuses two ranks on one device (the vllm-server broadcast is untested here)")
    from transformers import AutoModelForCausalLM

    from memagent.rl.vllm.engine import ServerWeights, trained_weights

    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_receiver, args=(there, str(model_dir)), daemon=True)
    proc.start()

    def post(path: str, body: dict[str, Any]) -> Any:
        if path != "/collective_rpc":
            return None
        here.send((body["method"], body["args"]))
        return {"results": [here.recv()]}

    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda(0)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1.5)
        sw = ServerWeights("http://local", "127.0.0.1", 29555, post=post)
        sw.connect(torch.device("cuda:0"))
        chunks = sw.push(trained_weights(model), 1 << 20)
        got, want = float(post("/collective_rpc", {"method": "memagent_checksum", "args": []})["results"][0]), param_sum(model)
        if abs(got - want) > 1e-3 * max(1.0, abs(want)):
            raise AssertionError(f"receiver sum {got:.6f} != sender {want:.6f}")
        return f"{chunks} chunks broadcast; receiver sum {got:.4f} == sender {want:.4f}"
    finally:
        here.send((None, None))
        proc.join(timeout=30)


def main() -> int:
    if not torch.cuda.is_available():
        print("FAIL gpu: no CUDA GPU visible to torch; run scripts/gpu_check.sh on a machine with a GPU", flush=True)
        return 2
    print(f"GPU: {torch.cuda.get_device_name(0)} x {torch.cuda.device_count()}; torch {torch.__version__}", flush=True)
    model_dir = tiny_dir()
    made: list[Any] = []  # one engine (sleep mode on) for both vLLM paths: vLLM starts once per process

    def first_vllm_path() -> str:
        made.append(make_engine(model_dir))
        return vllm_weight_push(*made[0])

    check("vllm_weight_push", first_vllm_path)
    if made:
        check("vllm_sleep_wake", lambda: vllm_sleep_wake(*made[0]))
    else:
        RESULTS.append(("vllm_sleep_wake", "FAIL", "the vLLM engine did not start"))
        print("FAIL vllm_sleep_wake: the vLLM engine did not start (see vllm_weight_push)", flush=True)
    if made:
        check("vllm_lora_push", lambda: vllm_lora_push(*made[0]))
    check("flash_attn_varlen", lambda: flash_attn_varlen(model_dir))
    check("nccl_broadcast", lambda: nccl_broadcast(model_dir))
    print("summary: " + ", ".join(f"{n} {s}" for n, s, _ in RESULTS), flush=True)
    return 1 if any(s == "FAIL" for _, s, _ in RESULTS) else 0


if __name__ == "__main__":
    sys.exit(main())
