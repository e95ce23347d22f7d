"""On a GPU host: the server sees exactly the GPUs of its claim (CUDA_VISIBLE_DEVICES)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]

PROBE = """
import json, sys, torch
print("PROBE " + json.dumps({"count": torch.cuda.device_count(),
                             "name": torch.cuda.get_device_name(0) if torch.cuda.device_count() else ""}))
"""


def test_server_sees_only_its_claimed_gpu(tmp_path: Path) -> None:
    from tuner.targets.process import ServerProcess

    last = torch.cuda.device_count() - 1
    s = ServerProcess([sys.executable, "-c", PROBE], log_path=tmp_path / "probe.log", gpus=(last,),
                      state_dir=tmp_path)
    s.start()
    assert s.proc is not None
    assert s.proc.wait(timeout=120) == 0
    s.stop()
    line = next(x for x in s.log_tail().splitlines() if x.startswith("PROBE "))
    info = json.loads(line[len("PROBE "):])
    assert info["count"] == 1
    assert info["name"] == torch.cuda.get_device_name(last)
