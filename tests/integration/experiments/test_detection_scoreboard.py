"""The detection experiment's scoreboard (experiments/detection/scoreboard.py): issue 24's goals judged per stream
from run.py's and bound.py's tables, on tables written here in their format, and on the committed ones."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DETECTION = ROOT / "experiments" / "detection"
sys.path.insert(0, str(DETECTION))

import scoreboard  # noqa: E402

FA_HEADER = ("| set | stream | hours watched | events | per 24 h | episodes | per 24 h | kinds | windows whose "
             "latencies were not judged |\n|---|---|---:|---:|---:|---:|---:|---|---:|\n")
INJ_HEADER = ("| before the change | change | source | trials | found | missed | median delay (windows) | p90 delay | "
              "median delay from the input's rise | ITL mean: windows | classified as expected | first events | "
              "with a saturation event | with a false alarm before |\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|"
              "---:|---|---:|---:|\n")


def _fa(stream: str, kind: str, hours: float, events: float, episodes: float) -> str:
    return (f"| held out (`{stream}/stationary_b`) | {kind} | {hours:g} | 0 | {events:.2f} | 0 | {episodes:.2f} "
            "| - | 0% |\n")


def _inj(stream: str, change: str, found: int, median: float, expected: int, rise: str = "-") -> str:
    return (f"| held out (`{stream}/stationary_b`) | {change} | recorded | 100 | {found} | {100 - found} "
            f"| {median:g} | 9 | {rise} | - | {expected}/100 | x | 0 | 0 |\n")


def _board(tmp_path: Path, *tables: str, bound: str | None = None) -> dict[str, scoreboard.Stream]:
    streams: dict[str, scoreboard.Stream] = {}
    for i, text in enumerate(tables):
        (tmp_path / f"t{i}.md").write_text(text)
        scoreboard.read_table(tmp_path / f"t{i}.md", streams)
    if bound is not None:
        (tmp_path / "bound.md").write_text(bound)
        scoreboard.read_bound(tmp_path / "bound.md", streams)
    return streams


def test_each_goal_is_judged_from_the_rows_that_say_it(tmp_path: Path) -> None:
    window, blocks = "bootstrap, window by window", "bootstrap, blocks of 8 windows"
    starts = "as recorded, from each of 30 starts after a warm-up of 0 windows (alarms at windows 3)"
    t240 = FA_HEADER + _fa("a", window, 240, 2.0, 2.0) + _fa("b", blocks, 240, 1.2, 0.8) \
        + _fa("c", window, 240, 0.3, 0.3)
    t1200 = FA_HEADER + _fa("a", window, 1200, 0.5, 0.5) + _fa("c", starts, 10, 1.5, 1.5)
    inj = INJ_HEADER + _inj("a", "rate_x2", 100, 3, 100, rise="2") + _inj("a", "slowdown30", 40, 7, 35) \
        + _inj("b", "slowdown_x2", 62, 7, 62) + _inj("c", "prompt_x2", 100, 2, 100, rise="2")
    bound = ("| stream | window s | change | fewest windows, ITL mean (23 tests) | (this test alone) |\n"
             "|---|---:|---|---:|---:|\n| a | 15 | slowdown30 (recorded) | 4 | 3 |\n"
             "| z | 15 | slowdown30 (recorded) | 1 | 1 |\n")
    s = _board(tmp_path, t240, t1200, inj, bound=bound)
    assert set(s) == {"a", "b", "c"}  # the bound's stream z, in no table given, is not a stream
    assert s["a"].false_alarms["window"].hours == 1200  # the longest replay of a kind stands
    a, b, c = (scoreboard.verdict(s[n]) for n in "abc")
    assert a.false_alarms == "met"
    assert a.delay == "not met: rate_x2 3 (2 from the input's rise); slowdown30 7, bound 4"
    assert a.slowdowns == "not met: slowdown30 35/40" and a.x2 == "met"
    assert b.false_alarms == "met as episodes (1.20 events a day)" and b.x2 == "not met: slowdown_x2 62/100"
    assert c.false_alarms == "not met (1.50 episodes a day)" and c.delay == "met" and c.slowdowns == "no rows"
    text = scoreboard.render(s, [tmp_path / "t0.md"], [])
    assert "(false alarms, delay, x2, slowdowns an anomaly): 2/3, 1/3, 2/3, 1/2." in text


def test_the_committed_tables_give_a_row_per_stream() -> None:
    out = subprocess.run([sys.executable, "scoreboard.py", "--tables", "table.md", "table-vllm-share-error.md",
                          "--bound", "table-bound.md"], cwd=DETECTION, capture_output=True, text=True, check=True,
                         timeout=60).stdout
    rows = [line for line in out.splitlines() if line.startswith("| ") and not line.startswith("| stream")]
    assert {line.split(" | ")[0][2:] for line in rows} >= {"quiet", "quiet5", "busy3", "vllm", "vllm2"}
    assert all(line.count(" | ") == 17 for line in rows)


def test_a_server_slowed_in_its_own_life_counts_toward_each_goal(tmp_path: Path) -> None:
    life = ("| stream | starts (windows) | slowdowns watched | found | as anomaly | median delay | p90 delay | hours "
            "watched outside them | events | per 24 h | episodes | per 24 h | kinds | at windows |\n"
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n"
            "| held out (`v/stationary_b`) | 10 (5-14) | 40 | 38 | 36 | 3 | 5 | 12.0 | 1 | 2.00 | 1 | 2.00 | "
            "anomaly/latency 1 | 90 |\n")
    s = _board(tmp_path, FA_HEADER + _fa("v", "bootstrap, window by window", 240, 0.1, 0.1), life)
    v = scoreboard.verdict(s["v"])
    assert s["v"].false_alarms["life"].hours == 12.0
    assert v.false_alarms == "not met (2.00 episodes a day)"
    assert v.delay == "not met: slowdown_life 3" and v.slowdowns == "not met: slowdown_life 36/38"
    assert v.x2 == "no rows"
    row = next(line for line in scoreboard.render(s, [], []).splitlines() if line.startswith("| v |"))
    assert "2.00 / 2.00 (12 h)" in row and "38/40, 3" in row


def test_a_lifes_rate_x2_and_its_return_count_toward_the_delay_and_x2_goals(tmp_path: Path) -> None:
    drifts = ("| stream | change | first window | windows | found | as drift | median delay | p90 delay | open from "
              "before |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n"
              "| held out (`v/stationary_b`) | rate_x2 | 76 | 32 | 20/20 | 20 | 2 | 3 | 0 |\n"
              "| held out (`v/stationary_b`) | rate back | 108 | 1 | 19/20 | 18 | 3 | 4 | 0 |\n")
    s = _board(tmp_path, FA_HEADER + _fa("v", "bootstrap, window by window", 240, 0.1, 0.1), drifts)
    row = s["v"].injected["drift_life"]
    assert (row.trials, row.found, row.median, row.expected) == (40, 39, 3.0, 38)
    v = scoreboard.verdict(s["v"])
    assert v.delay == "not met: drift_life 3" and v.x2 == "not met: drift_life 39/40"
    assert v.slowdowns == "no rows"  # a drift is no slowdown
    line = next(x for x in scoreboard.render(s, [], []).splitlines() if x.startswith("| v |"))
    assert "39/40, 3" in line and line.count(" | ") == 17
    # a table holding two commands' output (the life's changes printed by each) counts each change once; a
    # life's prompts and outputs changed and back count as its rate's do
    lengths = drifts.replace("rate_x2 | 76", "prompt_x2 | 76").replace("rate back", "prompt back")
    twice = _board(tmp_path, lengths + "\n" + lengths)["v"].injected["drift_life"]
    assert (twice.trials, twice.found, twice.median, twice.expected) == (40, 39, 3.0, 38)
