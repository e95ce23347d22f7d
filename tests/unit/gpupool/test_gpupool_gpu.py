"""GPU-only checks of the pool's NVML inventory and the vLLM target's hardware description."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]


def test_pool_of_none_sees_every_gpu() -> None:
    from tuner.placement.gpupool import GpuPool, visible_gpu_ids

    ids = visible_gpu_ids()
    assert len(ids) >= 1
    pool = GpuPool(None)
    assert pool.ids == tuple(ids)
    with pool.claim(1, label="gpu") as gpus:
        assert len(gpus) == 1 and gpus[0] in ids


def test_vllm_describe_names_the_gpu() -> None:
    from tuner.targets.vllm import VllmOptions, VllmTarget, gpu_inventory

    model, count = gpu_inventory()
    assert count >= 1 and model != "unknown"
    assert torch.cuda.get_device_name(0).split()[-1] in model or model in torch.cuda.get_device_name(0)
    t = VllmTarget(VllmOptions(model="m"), agent_dir=__import__("pathlib").Path("."))
    d = t.describe()
    assert d["gpu_model"] == model and d["gpu_count"] == str(count)
    assert t.facts() == {"node_gpus": count}
