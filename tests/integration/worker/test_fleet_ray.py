"""Ray placement: a real local Ray cluster of two nodes with 4 declared GPUs each (ray.cluster_utils.Cluster).

The GPUs are fake (declared counts: this machine has none), the placement is Ray's: each trial is a Ray task
asking for TP GPUs; the sim target runs inside it, on the node Ray picked. One cluster for the module.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from tuner.agent import load_agent  # noqa: E402
from tuner.fleet.worker import run_worker  # noqa: E402
from tuner.loop import open_session  # noqa: E402
from tuner.study.study import not_budget  # noqa: E402

pytestmark = pytest.mark.slow

AGENT = """\
name: ray-fleet
target: {{kind: sim, hardware: a100-80gb-sxm, model: llama-3-8b, num_gpus: 8}}
search_space:
  params:
    tensor_parallel_size: {{type: categorical, choices: [1, 2, 4, 8], default: 1}}
    max_num_seqs: {{type: int, low: 16, high: 256, log: true, default: 128}}
workload:
  arrival: {{kind: closed, concurrency: 32}}
  prompt_tokens: {{dist: uniform, low: 64, high: 512}}
  output_tokens: {{dist: fixed, value: 64}}
  num_requests: 400
objectives: [{{metric: output_throughput, direction: maximize}}]
candidates:  # every size a node can hold is tried, whatever the sampler draws in which thread
  - {{name: tp2, params: {{tensor_parallel_size: 2}}}}
  - {{name: tp4, params: {{tensor_parallel_size: 4}}}}
sampler: {{name: random, seed: 1}}
budget: {{trials: 14}}
tracking: {{enabled: false}}
executor: {{kind: ray, address: "{address}", cpus_per_trial: 1}}
parallel_trials: 4
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    from ray.cluster_utils import Cluster

    node = {"num_cpus": 4, "num_gpus": 4, "object_store_memory": 100 * 1024 * 1024}
    c = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    c.add_node(**node)
    c.wait_for_nodes()
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


def test_ray_places_tp_trials_on_two_nodes_without_sharing_a_gpu(cluster: Any, tmp_path: Path) -> None:
    p = tmp_path / "agent.yaml"
    p.write_text(AGENT.format(address=cluster.address))
    session = open_session(load_agent(p), tmp_path / "state")
    result = run_worker(session)
    # 14 budget trials; a configuration proposed while another thread ran it is a repeat (or set aside as a
    # copy), no budget trial
    assert sum(o.repeat_of is None for o in result.outcomes) == 14
    trials = [t for t in session.study.trials() if t.user_attrs.get("duplicate_of") is None]
    assert sum(not not_budget(t) for t in trials) == 14
    held: dict[tuple[str, int], list[tuple[float, float, int]]] = defaultdict(list)
    nodes = set()
    tps = set()
    for t in trials:
        tp = t.params["tensor_parallel_size"]
        if tp > 4:  # no node has 8 GPUs: infeasible at once, never placed
            assert t.user_attrs["cause"] == "infeasible_config"
            assert "node" not in t.user_attrs
            continue
        assert t.user_attrs.get("cause") is None, t.user_attrs
        gpus = t.user_attrs["gpus"]
        assert len(gpus) == tp and len(set(gpus)) == tp and all(0 <= g < 4 for g in gpus)
        start, end = t.user_attrs["placed_s"]
        nodes.add(t.user_attrs["node"])
        tps.add(tp)
        for g in gpus:
            held[(t.user_attrs["node"], g)].append((start, end, t.number))
    assert tps == {1, 2, 4}  # the baseline (1) and the two candidates at least
    assert len(nodes) == 2  # both nodes served trials
    for (node, gpu), spans in held.items():  # no GPU of a node ever held by two trials at once
        spans.sort()
        for (_s1, e1, n1), (s2, _e2, n2) in zip(spans, spans[1:], strict=False):
            assert s2 >= e1, f"GPU {gpu} of node {node} held by trials {n1} and {n2} at once"
