"""The `--ray` flags without Ray: the bare flag, the worker plan, the checks (fast; Ray itself is in test_ray.py)."""
from __future__ import annotations

import pytest

from memagent.backends.options import BackendOptions
from memagent.errors import InputError
from memagent.scale.options import RayOptions, bare_ray_flag, endpoints, plan_workers


def test_a_bare_ray_flag_means_a_local_instance():
    assert bare_ray_flag(["eval", "--ray"]) == ["eval", "--ray=local"]
    assert bare_ray_flag(["eval", "--ray", "--no-progress"]) == ["eval", "--ray=local", "--no-progress"]
    assert bare_ray_flag(["eval", "--ray", "auto", "--ray-workers", "2"]) == ["eval", "--ray", "auto",
                                                                              "--ray-workers", "2"]
    assert bare_ray_flag(["ask", "--ray=10.0.0.1:6379"]) == ["ask", "--ray=10.0.0.1:6379"]


def test_one_actor_per_endpoint():
    b = BackendOptions(name="openai", base_url="http://a:1/v1, http://b:2/v1", max_concurrency=8)
    specs = plan_workers(b, None, cluster_gpus=4.0)
    assert [s.backend.base_url for s in specs] == ["http://a:1/v1", "http://b:2/v1"]
    assert all(s.num_cpus == 0 and s.num_gpus == 0 and s.backend.max_concurrency == 8 for s in specs)
    three = plan_workers(b, 3, cluster_gpus=0.0)  # endpoints taken in turn
    assert [s.backend.base_url for s in three] == ["http://a:1/v1", "http://b:2/v1", "http://a:1/v1"]
    assert endpoints(None) == [None]
    with pytest.raises(InputError, match="names no URL"):
        endpoints(" , ")


def test_in_process_engines_take_one_gpu_each_or_one_cpu():
    gpu = plan_workers(BackendOptions(name="transformers"), None, cluster_gpus=3.0)
    assert [(s.num_cpus, s.num_gpus) for s in gpu] == [(1.0, 1.0)] * 3  # one per GPU of the cluster
    tp2 = plan_workers(BackendOptions(name="vllm", tensor_parallel=2), None, cluster_gpus=5.0)
    assert [s.num_gpus for s in tp2] == [2.0, 2.0]  # 5 GPUs hold two engines of 2
    cpu = plan_workers(BackendOptions(name="transformers", device="cpu"), 2, cluster_gpus=8.0)
    assert [(s.num_cpus, s.num_gpus) for s in cpu] == [(1.0, 0.0)] * 2  # --device cpu never holds a GPU
    assert len(plan_workers(BackendOptions(name="transformers"), None, cluster_gpus=0.0)) == 1


@pytest.mark.parametrize("kwargs, message", [
    (dict(workers=2), "--ray-workers is for --ray"),
    (dict(address="local", workers=0), "--ray-workers must be a positive integer, got 0"),
    (dict(address=" "), "--ray ADDRESS is empty"),
])
def test_bad_ray_options(kwargs, message):
    with pytest.raises(InputError, match=message):  # refused as they are built
        RayOptions(**kwargs)


def test_cli_refuses_ray_without_input_and_workers_without_ray(run_cli, tmp_path):
    doc = tmp_path / "d.txt"
    doc.write_text("text")
    code, _, err = run_cli("ask", "--model", "m", "--question", "q", "--document", doc, "--ray")
    assert code == 2 and err.strip() == ("error: --ray shards many questions over Ray actors; give them with "
                                         "--input FILE.jsonl")
    code, _, err = run_cli("ask", "--model", "m", "--question", "q", "--document", doc, "--ray-workers", 2)
    assert code == 2 and "--ray-workers is for --ray" in err


def test_without_ray_installed_the_error_says_what_to_install(monkeypatch):
    import sys

    from memagent.scale.pool import RayRunError, connect

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(RayRunError, match=r"--ray needs Ray: pip install 'memagent\[ray\]'"):
        connect("local")
