"""The Ray executor (`executor: {kind: ray, address: ...}`): each trial is a Ray task that asks for its GPUs.

    executor: {kind: ray, address: "auto"}     # or "10.0.0.5:6379", or "ray://head:10001"

Ray places the task on a node with TP x DP free GPUs (declared by each node's `ray start --num-gpus`) and
hands it their ids (ray.get_gpu_ids(), also CUDA_VISIBLE_DEVICES); the task deploys the configuration and runs
the load generator there, on the node Ray picked, so the load never crosses the network; only the
measurement (a summary and its request records) comes back. The tuner process stays the Optuna client: it
asks and tells; Ray only places. A trial needing more GPUs than any node has is infeasible at once (Ray
would wait for it forever). A stop request cancels the task (the deployment's teardown runs on the node).

Without Ray (`executor: {kind: local}`, the default) the single-node GPU pool (tuner.placement.gpupool) places trials.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.errors import ConfigError, InfeasibleConfig, Interrupted, TrialError

log = logging.getLogger(__name__)


@dataclass
class Placement:
    """Where a trial ran: the node Ray picked, its host, the GPU ids it was given, and when (epoch seconds)."""

    host: str
    node_id: str
    pid: int
    gpus: tuple[int, ...]
    start_s: float
    end_s: float

    def attrs(self) -> dict[str, Any]:
        return {"host": self.host, "node": self.node_id, "node_pid": self.pid, "gpus": list(self.gpus),
                "placed_s": [round(self.start_s, 3), round(self.end_s, 3)]}


def _run_on_node(target: Any, config: Mapping[str, Any], workload: Any, goodput_ms: Mapping[str, float],
                 seed: int, trial_number: int, label: str, state_dir: str) -> tuple[Any, str | None, Placement]:
    """The body of a trial's Ray task: deploy on this node's assigned GPUs, measure, tear down."""
    import ray

    from tuner.targets.base import TrialContext

    gpus = tuple(int(g) for g in ray.get_gpu_ids())
    ctx = TrialContext(trial_number=trial_number, state_dir=Path(state_dir), gpus=gpus, seed=seed, label=label)
    start = time.time()
    with target.deploy(config, ctx) as dep:
        m = dep.measure(workload, goodput_ms=goodput_ms, seed=seed)
        log_path = str(dep.log_path) if dep.log_path is not None else None
    placement = Placement(host=socket.gethostname(), node_id=ray.get_runtime_context().get_node_id(),
                          pid=os.getpid(), gpus=gpus, start_s=start, end_s=time.time())
    return m, log_path, placement


class RayExecutor:
    """Runs trials as Ray tasks on a Ray cluster (connects once, on first use)."""

    def __init__(self, address: str | None, *, cpus_per_trial: float = 1.0) -> None:
        self.address = address
        self.cpus_per_trial = cpus_per_trial
        self._lock = threading.Lock()
        self._remote: Any = None

    def _connect(self) -> Any:
        with self._lock:
            if self._remote is None:
                try:
                    import ray
                except ImportError:
                    raise ConfigError("executor kind 'ray' needs Ray: pip install 'tuner[ray]'",
                                      field="executor.kind") from None
                if not ray.is_initialized():
                    ray.init(address=self.address, logging_level=logging.WARNING, log_to_driver=False)
                self._remote = ray.remote(_run_on_node)
            return self._remote

    def max_gpus_per_node(self) -> int:
        import ray

        return max((int(n.get("Resources", {}).get("GPU", 0)) for n in ray.nodes() if n.get("Alive")), default=0)

    def measure(self, session: Any, config: Mapping[str, Any], ctx: Any, need: int,
                goodput_ms: Mapping[str, float]) -> tuple[Any, str | None, Placement]:
        """Run the trial on the node Ray picks for `need` GPUs (`goodput_ms`: the per-request thresholds of the
        agent's SLOs); returns (measurement, log path, placement)."""
        import ray
        from ray.exceptions import RayTaskError, TaskCancelledError

        remote = self._connect()
        most = self.max_gpus_per_node()
        if need > most:
            raise InfeasibleConfig(f"needs {need} GPUs on one node; the Ray cluster's largest node has {most}")
        spec = session.agent.spec
        ref = remote.options(num_gpus=need, num_cpus=self.cpus_per_trial, max_retries=0).remote(
            session.target, dict(config), spec.workload, dict(goodput_ms), ctx.seed,
            ctx.trial_number, ctx.label or f"trial-{ctx.trial_number}", str(ctx.state_dir.resolve()))
        while True:
            done, _ = ray.wait([ref], timeout=0.5)
            if done:
                break
            if ctx.stop_event.is_set():
                ray.cancel(ref, force=False)
                raise Interrupted("stop requested while the trial ran on Ray")
        try:
            m, log_path, placement = ray.get(ref)
        except TaskCancelledError:
            raise Interrupted("the trial's Ray task was cancelled") from None
        except RayTaskError as exc:
            cause = exc.cause
            if isinstance(cause, TrialError):
                raise cause from None
            raise TrialError(f"the trial's Ray task failed: {type(cause).__name__}: {cause}",
                             cause="internal_error") from None
        return m, log_path, placement


def make_executor(spec: Any) -> RayExecutor | None:
    """The executor of an agent's spec: a RayExecutor, or None for the local GPU pool."""
    ex = getattr(spec, "executor", None)
    if ex is None or ex.kind == "local":
        return None
    return RayExecutor(ex.address, cpus_per_trial=ex.cpus_per_trial)
