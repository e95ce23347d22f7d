"""The detection experiment's slowdowns in a server's own life: record_vllm.py --interleave's plan and checks (one
load, the server slowed several times in it, each switch right after a scrape; against a real vLLM in
test_detection_vllm_stream.py), run.py's windows across a switch, and its replay of the committed interleaved
stream in recorded order."""

from __future__ import annotations

import gzip
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
DETECTION = ROOT / "experiments" / "detection"
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
STREAM = DETECTION / "recorded-vllm-interleaved.jsonl.gz"
MODEL = ROOT / "experiments" / "sim-calibration" / "model-cpu.json"
sys.path.insert(0, str(DETECTION))

import record  # noqa: E402
import record_vllm  # noqa: E402
import run  # noqa: E402


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in gzip.open(path, "rt", encoding="utf-8")]


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return path


def test_the_interleaved_plan_leads_then_alternates_slowdown_and_calm() -> None:
    segs = record_vllm.interleaved(["slowdown30"] * 3, 600.0, {"slowdown30": 120.0})
    assert segs[0] == ("stationary_b", 600.0, 0.0, 0.0)
    assert segs[1:] == [("slowdown30", 120.0, 0.3, 0.0), ("stationary_b", 300.0, 0.0, 0.0)] * 3


def test_a_life_with_a_rate_x2_adds_a_second_load_and_a_calm_as_long_after_it() -> None:
    segs = record_vllm.interleaved(["slowdown30", "rate_x2", "slowdown30"], 600.0, {"rate_x2": 420.0})
    assert segs == [("stationary_b", 600.0, 0.0, 0.0), ("slowdown30", 240.0, 0.3, 0.0),
                    ("stationary_b", 300.0, 0.0, 0.0), ("rate_x2", 420.0, 0.0, 1.0),
                    ("stationary_b", 420.0, 0.0, 0.0), ("slowdown30", 240.0, 0.3, 0.0),
                    ("stationary_b", 300.0, 0.0, 0.0)]
    with pytest.raises(ValueError, match="output_x2: each must be one of slowdown30, rate_x2, prompt_x2, output_x4"):
        record_vllm.interleaved(["output_x2"], 600.0, {})


def test_a_lifes_input_drifts_change_its_loads_lengths_with_a_calm_as_long_after_each() -> None:
    segs = record_vllm.interleaved(["prompt_x2", "slowdown30", "output_x4"], 600.0, {"output_x4": 360.0})
    assert segs == [("stationary_b", 600.0, 0.0, 0.0), ("prompt_x2", 480.0, 0.0, 0.0),
                    ("stationary_b", 480.0, 0.0, 0.0), ("slowdown30", 240.0, 0.3, 0.0),
                    ("stationary_b", 300.0, 0.0, 0.0), ("output_x4", 360.0, 0.0, 0.0),
                    ("stationary_b", 360.0, 0.0, 0.0)]
    # each segment's own load: the base workload but where its phase changes the lengths (the plan's phases')
    plan = {name: wl for name, _, _, wl in record_vllm.plan(3.0)}
    for name in ("prompt_x2", "output_x4"):
        assert record.workload(3.0, **record_vllm.INPUTS[name]) == plan[name]


def test_a_closed_lifes_loads_are_closed_loops_of_n_requests_in_flight() -> None:
    import yaml

    from tuner.spec import WorkloadSpec

    spec = WorkloadSpec.model_validate(yaml.safe_load(record.workload(3.0, prompt_mean=200, closed=2)))
    assert (spec.arrival.kind, spec.arrival.concurrency) == ("closed", 2)
    assert spec.prompt_tokens.mean == 200  # the segment's lengths as an open loop's
    spec = WorkloadSpec.model_validate(yaml.safe_load(record.workload(3.0)))
    assert (spec.arrival.kind, spec.arrival.rate_per_s) == ("poisson", 3.0)


def test_a_lifes_changes_are_its_changed_runs_and_the_return_after_each_drift() -> None:
    phases = ["stationary_b"] * 3 + ["slowdown30"] * 2 + ["stationary_b"] * 2 + ["rate_x2"] * 3 + ["stationary_b"] * 2
    seq: run.Order = [(p, {}) for p in phases]
    assert run.changes_of(seq) == [(3, 5, "slowdown30"), (7, 10, "rate_x2"), (10, 11, run.RETURN)]
    more: run.Order = [(p, {}) for p in ["stationary_b", "prompt_x2", "prompt_x2", "stationary_b", "output_x4",
                                          "stationary_b", "slowdown30", "stationary_b"]]
    assert run.changes_of(more) == [(1, 3, "prompt_x2"), (3, 4, "prompt back"), (4, 5, "output_x4"),
                                    (5, 6, "output back"), (6, 7, "slowdown30")]
    assert {run.EXPECTED[c] for *_, c in run.changes_of(more)} == {"drift", "anomaly"}
    assert [run.EXPECTED[c] for *_, c in run.changes_of(more)][-1] == "anomaly"
    assert run.episodes_of(seq) == [(3, 5)]
    assert run.changes_of([(p, {}) for p in ["stationary_b", "rate_x2"]]) == [(1, 2, "rate_x2")]  # no return yet


def test_a_window_across_a_switch_is_kept_only_where_the_next_row_starts_its_phase(tmp_path: Path) -> None:
    rows = [r for r in _rows(STREAM) if r["phase"] and r["text"]]
    first = next(i for i, r in enumerate(rows) if r.get("starts_phase"))
    part = rows[first - 3:first + 3]
    kept = [phase for phase, *_ in run.windows(_write(tmp_path / "a.jsonl.gz", part))]
    assert kept == ["stationary_b", "stationary_b", "slowdown30", "slowdown30", "slowdown30"]
    unmarked = [{k: v for k, v in r.items() if k != "starts_phase"} for r in part]
    dropped = [p for p, *_ in run.windows(_write(tmp_path / "b.jsonl.gz", unmarked))]
    assert dropped == ["stationary_b", "stationary_b", "slowdown30", "slowdown30"]  # the window across: gone
    assert run.interleaved(tmp_path / "b.jsonl.gz") is None  # phases recorded apart
    seq = run.interleaved(tmp_path / "a.jsonl.gz")
    assert seq is not None and run.episodes_of(seq) == [(2, 5)]


def test_the_committed_stream_is_one_servers_life_with_four_slowdowns() -> None:
    rows = [r for r in _rows(STREAM) if r["phase"]]
    assert {r["server"] for r in rows} == {"vllm"} and {r["load_seed"] for r in rows} == {"15000"}
    seq = run.interleaved(STREAM)
    assert seq is not None
    runs = run.episodes_of(seq)
    assert len(runs) == 4 and all(b - a >= 14 for a, b in runs)  # 240 s each in 15-s windows
    # a 600-s lead, then 300 s of calm between slowdowns: 40 and 20 windows
    assert runs[0][0] >= 38 and all(a2 - b1 >= 18 for (_, b1), (a2, _) in zip(runs, runs[1:], strict=False))
    slow = {r["step_slowdown_frac"] for r in rows if r["phase"] == "slowdown30"}
    assert slow == {0.3}


def _own_life(label: str, stream: Path, change: str, *extra: str) -> str:
    """run.py's own-life section for a committed life (5 trials of one injected change beside it)."""
    proc = subprocess.run([sys.executable, str(DETECTION / "run.py"), "--streams", f"{label}={stream}", "--tuned",
                           "none", "--held-out", f"{label}/stationary_b", "--only-injected", "--trials", "5",
                           "--changes", change, "--sim-model", str(MODEL), *extra],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout[proc.stdout.index("## Slowdowns in the server's own life"):]


def test_run_reports_each_slowdown_of_the_interleaved_stream_in_its_recorded_order() -> None:
    section = _own_life("vllm5", STREAM, "slowdown30")
    rows = [r.split("|") for r in section.splitlines() if r.startswith("| held out (`vllm5/stationary_b`)")]
    seq = run.interleaved(STREAM)
    assert seq is not None
    runs = run.episodes_of(seq)
    assert [(int(r[3]), int(r[4])) for r in rows[:len(runs)]] == [(a, b - a) for a, b in runs]
    for r in rows[:len(runs)]:
        found, starts = map(int, r[5].split("/"))
        assert 0 < starts and found <= starts and int(r[6]) <= found and int(r[9]) <= starts - found
    summary = rows[len(runs):]
    assert len(summary) == 1
    starts = int(summary[0][2].split()[0])
    watched, found, anomalies = (int(summary[0][i]) for i in (3, 4, 5))
    assert watched == starts * len(runs) and anomalies <= found <= watched
    assert float(summary[0][8]) > 0  # the stationary hours watched outside the slowdowns


def test_record_vllm_refuses_only_with_a_life_and_a_bad_duration_or_change(tmp_path: Path) -> None:
    for extra, said in ((["--interleave", "2", "--only", "base"], "--only is for the plan's phases"),
                        (["--interleave", "2", "--seconds", "base=60"], "--seconds base=60: PHASE=S with PHASE one "
                                                                         "of slowdown30, rate_x2, prompt_x2, "
                                                                         "output_x4, stationary_b"),
                        (["--interleave", "-1"], "--interleave must be >= 0"),
                        (["--life", "slowdown30,output_x2"], "--life slowdown30,output_x2: each change must be one "
                                                             "of slowdown30, rate_x2, prompt_x2, output_x4"),
                        (["--life", "rate_x2", "--interleave", "1"], "--interleave N and --life CHANGES both name"),
                        (["--life", "rate_x2", "--only", "base"], "--only is for the plan's phases"),
                        (["--closed", "2"], "--closed N: N >= 1 requests in flight, with --interleave or --life"),
                        (["--life", "rate_x2", "--closed", "-1"], "--closed N: N >= 1 requests in flight"),
                        (["--life", "rate_x2", "--omp-threads", "1"], "--omp-threads N: N >= 1 threads, with "
                                                                      "--uni-executor (got 1)"),
                        (["--life", "rate_x2", "--uni-executor", "--omp-threads", "-2"], "--omp-threads N: N >= 1"),
                        (["--life", "rate_x2", "--out", str(DETECTION / "recorded-vllm-life.jsonl.gz")],
                         "recorded-vllm-life.jsonl.gz exists (a recording of its own?)")):
        proc = subprocess.run([sys.executable, str(DETECTION / "record_vllm.py"), "--out",
                               str(tmp_path / "x.jsonl.gz"), *extra], capture_output=True, text=True, timeout=60,
                              cwd=ROOT)
        if not VLLM_PYTHON.exists():
            assert ".venv-vllm" in proc.stderr
            continue
        assert proc.returncode == 2 and said in proc.stderr, proc.stderr
        assert not (tmp_path / "x.jsonl.gz").exists()


LIFE = DETECTION / "recorded-vllm-life.jsonl.gz"
LIFE_CHANGES = ["slowdown30", "rate_x2", run.RETURN, "slowdown30", "rate_x2", run.RETURN, "slowdown30"]


def test_the_committed_life_holds_three_slowdowns_and_two_doublings_of_its_traffic() -> None:
    rows = [r for r in _rows(LIFE) if r["phase"]]
    assert {r["server"] for r in rows} == {"vllm"} and {r["load_seed"] for r in rows} == {"17000"}
    assert {r["base_rate"] for r in rows} == {2.0}
    seq = run.interleaved(LIFE)
    assert seq is not None
    changes = run.changes_of(seq)
    assert [c for *_, c in changes] == LIFE_CHANGES
    assert all(b - a >= 14 for a, b, c in changes if c == "slowdown30")  # 240 s in 15-s windows
    assert all(b - a >= 30 for a, b, c in changes if c == "rate_x2")  # 480 s
    rate = {p: statistics.median(w["rate_per_s"] for q, w in seq if q == p) for p in ("stationary_b", "rate_x2")}
    assert 1.6 < rate["rate_x2"] / rate["stationary_b"] < 2.4  # a second load at the base rate beside the first


LIFE2 = DETECTION / "recorded-vllm-life2.jsonl.gz"
LIFE2_CHANGES = ["prompt_x2", "prompt back", "slowdown30", "output_x4", "output back", "slowdown30"]


def test_the_committed_second_life_changes_its_prompts_and_outputs_each_segment_a_load_of_its_own() -> None:
    rows = [r for r in _rows(LIFE2) if r["phase"]]
    assert {r["server"] for r in rows} == {"vllm"} and {r["base_rate"] for r in rows} == {3.0}
    assert {r["load_seed"] for r in rows} == {str(18000 + 2 * k) for k in range(9)}  # segment k's own load
    seq = run.interleaved(LIFE2)
    assert seq is not None
    assert [c for *_, c in run.changes_of(seq)] == LIFE2_CHANGES

    def median(phase: str, signal: str) -> float:
        return statistics.median(w[signal] for q, w in seq if q == phase)

    assert 1.8 < median("prompt_x2", "prompt_tokens_mean") / median("stationary_b", "prompt_tokens_mean") < 2.2
    assert 3.6 < median("output_x4", "output_tokens_mean") / median("stationary_b", "output_tokens_mean") < 4.4
    for phase in ("prompt_x2", "output_x4", "slowdown30"):  # the rate unchanged by a change of lengths
        assert 0.9 < median(phase, "rate_per_s") / median("stationary_b", "rate_per_s") < 1.1


@pytest.mark.parametrize(("label", "stream", "change"), [("vllm7", LIFE, "rate_x2"), ("vllm8", LIFE2, "prompt_x2")])
def test_run_reports_each_change_of_a_committed_life_in_its_recorded_order(label: str, stream: Path,
                                                                            change: str) -> None:
    section = _own_life(label, stream, change)
    drifts = section[section.index("The traffic's changes in the same life"):]
    rows = [r.split("|") for r in drifts.splitlines() if r.startswith(f"| held out (`{label}/stationary_b`)")]
    seq = run.interleaved(stream)
    assert seq is not None
    want = [(a, b - a, c) for a, b, c in run.changes_of(seq) if c != "slowdown30"]
    assert [(int(r[3]), int(r[4]), r[2].strip()) for r in rows[:len(want)]] == want
    for r in rows[:len(want)]:
        found, starts = map(int, r[5].split("/"))
        assert found == starts > 0 and int(r[6]) == found  # each doubling and each return found, as a drift


def test_life_settled_leaves_out_each_returns_settling_and_refuses_a_stream_of_phases() -> None:
    cmd = [sys.executable, str(DETECTION / "life_settled.py"), "--tuned", "none", "--sim-model", str(MODEL),
           "--hours", "8"]
    proc = subprocess.run([*cmd, "--streams", f"vllm7={LIFE}", "--held-out", "vllm7/stationary_b"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seq = run.interleaved(LIFE)
    assert seq is not None
    calm = sum(p == run.CALM for p, _ in seq)
    returns = [a for a, _, c in run.changes_of(seq) if c == run.RETURN]
    assert f"{calm - 22 * len(returns)} of the life's {calm} stationary windows" in proc.stdout  # 20 learning + 2
    assert len([r for r in proc.stdout.splitlines() if r.startswith("| vllm7/stationary_b, each return")]) == 4
    apart = subprocess.run([*cmd, "--streams", f"vllm={DETECTION / 'recorded-vllm.jsonl.gz'}", "--held-out",
                            "vllm/stationary_b"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert apart.returncode == 1 and "not the stationary phase of a stream recorded with" in apart.stderr


CLOSED = DETECTION / "recorded-vllm-closed.jsonl.gz"


def test_the_committed_closed_life_answers_fewer_requests_when_slowed_with_as_many_in_the_server() -> None:
    rows = [r for r in _rows(CLOSED) if r["phase"]]
    assert {r["server"] for r in rows} == {"vllm"} and {r["closed_concurrency"] for r in rows} == {2}
    assert {r["load_seed"] for r in rows} == {str(20000 + 2 * k) for k in range(7)}
    seq = run.interleaved(CLOSED)
    assert seq is not None
    assert [c for *_, c in run.changes_of(seq)] == ["slowdown30", "rate_x2", run.RETURN, "slowdown30"]

    def ratio(phase: str, signal: str) -> float:
        return (statistics.median(w[signal] for q, w in seq if q == phase)
                / statistics.median(w[signal] for q, w in seq if q == "stationary_b"))

    assert 0.5 < ratio("slowdown30", "rate_per_s") < 0.9  # a slower server answers its two users less often ...
    assert 0.95 < ratio("slowdown30", "in_server_mean") < 1.05  # ... and they are still there (Little's law)
    assert 1.2 < ratio("rate_x2", "rate_per_s") < 2.0 and 1.9 < ratio("rate_x2", "in_server_mean") < 2.1  # 4 users


def _life_rows(section: str, label: str) -> tuple[list[list[str]], list[list[str]]]:
    """The own-life section's slowdown rows and its summary row (every slowdown from every start)."""
    rows = [r.split("|") for r in section.splitlines() if r.startswith(f"| held out (`{label}/stationary_b`)")]
    slow = [r for r in rows if r[2].strip().isdigit()]
    return slow, [r for r in rows if "(" in r[2]]


def test_a_closed_loops_slowdowns_are_anomalies_and_only_with_the_paced_rate() -> None:
    slow, summary = _life_rows(_own_life("vllm10", CLOSED, "slowdown30"), "vllm10")
    assert len(slow) == 2
    for r in slow:  # each slowdown from every start: found, as an anomaly
        found, starts = map(int, r[5].split("/"))
        assert found == starts > 0 and int(r[6]) == found
    assert int(summary[0][9]) == 0  # no event outside the changes in the life
    slow, _ = _life_rows(_own_life("vllm10", CLOSED, "slowdown30", "--no-paced-rate"), "vllm10")
    assert sum(int(r[6]) for r in slow) < sum(int(r[5].split("/")[0]) for r in slow) // 2  # most called drift
