"""The runner's graph bookkeeping on the CPU, with captured steps replayed by re-running them
(tests/support/gpu_doubles.py): the attention-length buckets, padded rows, the state kept across a
capture, warm-up capturing every (batch, bucket) pair, and one shared logits buffer."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.support.gpu_doubles import RerunGraphs
from tuner.engine.config import EngineConfig
from tuner.engine.kv_pool import KVPool
from tuner.engine.model import build_model
from tuner.engine.runner import Runner

CFG = EngineConfig(preset="tiny", device="cpu", max_model_len=512, kv_pool_mb=64, pre_allocate=True,
                   batching="continuous", max_batch_size=16, cuda_graphs=True, cuda_graph_max_batch=8)
LENGTHS = [30, 250, 100, 7, 180]  # prompt lengths of the sequences in slots 0..4


@pytest.fixture()
def setup() -> tuple[Runner, Runner, RerunGraphs, KVPool]:
    torch.manual_seed(0)
    mc = CFG.model_config()
    model = build_model(mc, dtype="float32", device="cpu")
    pool = KVPool(mc, dtype=torch.float32, device="cpu", pool_mb=CFG.kv_pool_mb, pre_allocate=True)
    backend = RerunGraphs()
    graphed = Runner(CFG, model, pool, "cpu", graph_backend=backend)
    eager = Runner(dataclasses.replace(CFG, cuda_graphs=False), model, pool, "cpu")
    gen = torch.Generator().manual_seed(1)
    for slot, n in enumerate(LENGTHS):
        assert pool.acquire() == slot
        prompt = torch.randint(0, mc.vocab_size, (n,), generator=gen).tolist()
        logits = graphed.prefill(prompt, 0, slot)
        for r in (graphed, eager):
            r.set_decode_state(slot, logits.argmax(), n)
    return graphed, eager, backend, pool


def test_graph_replays_equal_the_eager_step_across_attention_buckets(setup) -> None:
    graphed, eager, backend, pool = setup
    n = len(LENGTHS)
    assert graphed.attn_sizes == [256, 384, 512, 513]
    scratch_before = pool.data[:, :, n:8, :, : graphed.L].clone()  # the padded rows' real positions
    graphed.dec_pos[n:8] = torch.tensor([3, 0, 77])  # other sequences' decode state in the padded rows
    graphed.dec_tok[n:8] = torch.tensor([11, 12, 13])
    used = set()
    for step in range(10):  # the longest row crosses from the 256 bucket into the 384 one
        max_len = max(LENGTHS) + step + 1
        want = eager.decode(n, max_len).clone()
        got = graphed.decode(n, max_len).clone()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert torch.equal(graphed.dec_tok[:n], eager.dec_tok[:n])
        assert torch.equal(graphed.dec_pos[:n], eager.dec_pos[:n])
        used.add(graphed.attn_bucket(max_len))
    assert used == {256, 384}
    assert set(graphed.graphs) == {(8, 256), (8, 384)}  # batch 5 padded to the captured size 8
    assert backend.captures == 2 and backend.replays == 10
    # padded rows wrote only the scratch column of their slots, and their decode state is kept
    assert torch.equal(pool.data[:, :, n:8, :, : graphed.L], scratch_before)
    assert graphed.dec_pos[n:8].tolist() == [3, 0, 77] and graphed.dec_tok[n:8].tolist() == [11, 12, 13]


def test_a_capture_keeps_the_rows_state(setup) -> None:
    graphed, _, _, _ = setup
    tok, pos = graphed.dec_tok.clone(), graphed.dec_pos.clone()
    graphed.capture(8, 384)
    assert torch.equal(graphed.dec_tok, tok) and torch.equal(graphed.dec_pos, pos)


def test_warmup_captures_every_batch_size_and_bucket_into_one_logits_buffer(setup) -> None:
    graphed, _, backend, _ = setup
    graphed.capture_all()
    assert graphed.graph_sizes == [1, 2, 4, 8]
    assert set(graphed.graphs) == {(b, a) for b in graphed.graph_sizes for a in graphed.attn_sizes}
    assert backend.captures == 16
    assert graphed.graph_logits is not None
    base = graphed.graph_logits.untyped_storage().data_ptr()
    assert all(out.untyped_storage().data_ptr() == base for _, out in graphed.graphs.values())


def test_a_batch_larger_than_the_largest_graph_runs_eagerly_and_unpadded(setup) -> None:
    _, eager, _, pool = setup
    backend = RerunGraphs()
    graphed = Runner(dataclasses.replace(CFG, cuda_graph_max_batch=2), eager.model, pool, "cpu",
                     graph_backend=backend)
    assert graphed.graph_sizes == [1, 2]
    n = len(LENGTHS)
    graphed.dec_tok[:n] = eager.dec_tok[:n]
    graphed.dec_pos[:n] = eager.dec_pos[:n]
    rest = graphed.dec_pos[n:8].clone()
    want = eager.decode(n, max(LENGTHS) + 1)
    got = graphed.decode(n, max(LENGTHS) + 1)
    torch.testing.assert_close(got, want)
    assert got.shape[0] == n and backend.captures == 0 and not graphed.graphs
    assert torch.equal(graphed.dec_pos[n:8], rest)  # no padded rows


def test_a_batch_up_to_the_largest_graph_replays_it_when_that_size_is_not_a_bucket(setup) -> None:
    """cuda_graph_max_batch=6 is captured but is no padding bucket (1, 2, 4, 8, 16): a batch of 5 must pad
    to the graph of 6, not to the bucket 8 (which has no graph, so the step used to run eagerly and the
    captured graph of 6 was never replayed)."""
    _, eager, _, pool = setup
    backend = RerunGraphs()
    graphed = Runner(dataclasses.replace(CFG, cuda_graph_max_batch=6), eager.model, pool, "cpu",
                     graph_backend=backend)
    assert graphed.graph_sizes == [1, 2, 4, 6]
    n = len(LENGTHS)
    graphed.dec_tok[:n] = eager.dec_tok[:n]
    graphed.dec_pos[:n] = eager.dec_pos[:n]
    graphed.dec_pos[n] = 42  # another sequence's state in the padded row
    want = eager.decode(n, max(LENGTHS) + 1)
    got = graphed.decode(n, max(LENGTHS) + 1)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert set(graphed.graphs) == {(6, 256)} and backend.replays == 1
    assert torch.equal(graphed.dec_tok[:n], eager.dec_tok[:n]) and graphed.dec_pos[n] == 42
