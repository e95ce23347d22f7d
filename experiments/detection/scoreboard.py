"""Issue 24's goals, stream by stream, read from the detection tables run.py and bound.py printed.

    python experiments/detection/scoreboard.py --tables table.md table-busy.md ... --bound table-bound.md ...

Goals: at most one false alarm per 24 h of stationary traffic; a median delay of at most two scrape windows; no
miss of any x2 change; every injected slowdown classified as an anomaly. Nothing is measured here: every figure is
a row of a table given (for a stream and a replay the row with the most hours watched, the later table on a tie),
and the verdicts say which goal each stream meets, and where the delay goal is out of reach of any test at the
budget (bound.py's fewest windows for the ITL mean's levels at the shared budget, above 2).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

# bound.py's names of streams run.py labels otherwise (the recorded2 stream's held-out phase)
TABLE_NAME = {"busy": "stationary_b"}
DRIFTS = ("rate_x2", "prompt_x2", "output_x4")
# the goal's "no miss of any x2 change" (x4: more)
X2 = ("rate_x2", "prompt_x2", "output_x4", "slowdown_x2", "drift_life")
# slowdown_life: the +30 % slowdowns of a server slowed in its own life (run.py's "Slowdowns in the server's own
# life", a stream recorded by record_vllm.py --interleave), found in its recorded order
SLOWDOWNS = ("slowdown30", "slowdown_model", "slowdown_x2", "slowdown_life")
# drift_life: the inputs' changes in a server's own life (a second load beside the first, the prompts x2, the
# outputs x4) and the return to the base traffic after each (run.py's "The traffic's changes in the same life",
# record_vllm.py --life): found as the rows' sum, the latest median of them (run.py gives no delays, only each
# row's median)
LIFE_DRIFTS = ("rate_x2", "rate back", "prompt_x2", "prompt back", "output_x4", "output back")
CHANGES = (*DRIFTS, *SLOWDOWNS, "drift_life", "gpu_throttle")  # the changes' columns, in the delay goal
BOUND_CHANGE = {"slowdown30": "slowdown30 (recorded)", "slowdown_model": "latencies x1.3 (model)",
                "slowdown_x2": "latencies x2 (model)"}
REPLAYS = {"bootstrap, window by window": "window", "bootstrap, blocks of 8 windows": "blocks"}
LIFE_HEADER = ["stream", "starts (windows)", "slowdowns watched"]  # run.py's own-life summary table
LIFE_DRIFT_HEADER = ["stream", "change", "first window", "windows", "found", "as drift"]  # its traffic's changes
GOAL_FA_PER_DAY, GOAL_DELAY = 1.0, 2.0


@dataclass
class FalseAlarms:
    hours: float
    events_per_day: float
    episodes_per_day: float
    source: str


@dataclass
class Injected:
    trials: int
    found: int
    median: float
    from_rise: float  # a recorded drift's median delay from its input's rise (run.py's onset; nan: none)
    expected: int
    source: str


@dataclass
class Stream:
    name: str
    # "window", "blocks", "real order", "life" (an interleaved stream's windows outside its slowdowns)
    false_alarms: dict[str, FalseAlarms] = field(default_factory=dict)
    injected: dict[str, Injected] = field(default_factory=dict)
    bound: dict[str, float] = field(default_factory=dict)  # change -> fewest windows (23 tests)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _stream_name(cell: str) -> str | None:
    """`quiet5/stationary_b` -> quiet5; `stationary_b` -> stationary_b (the busy host's recorded2 stream)."""
    m = re.search(r"`([^`]+)`", cell)
    if m is None:
        return None
    label = m.group(1)
    return label.split("/")[0] if "/" in label else label


def _number(cell: str) -> float:
    try:
        return float(cell)
    except ValueError:
        return float("nan")


def _tables(lines: Iterable[str]) -> Iterator[tuple[list[str], list[str]]]:
    """(header cells, row cells) of every row of every markdown table in `lines`."""
    header: list[str] | None = None
    for line in lines:
        if not line.startswith("|"):
            header = None
            continue
        cells = _cells(line)
        if header is None:
            header = cells
        elif not all(set(c) <= set("-:") for c in cells):
            yield header, cells


def read_table(path: Path, streams: dict[str, Stream]) -> None:
    """The false-alarm and injected rows of one run.py table (several commands' tables in one file too: a life's
    change printed again by a later command counts once)."""
    merged: set[tuple[str, str, str]] = set()  # (stream, change, first window) of the life's changes taken
    for header, cells in _tables(path.read_text().splitlines()):
        if header[:2] == ["set", "stream"] and len(cells) >= 7:
            name = _stream_name(cells[0])
            kind = REPLAYS.get(cells[1], "real order" if cells[1].startswith("as recorded, from each") else None)
            if name is None or kind is None:
                continue
            fa = FalseAlarms(_number(cells[2]), _number(cells[4]), _number(cells[6]), path.name)
            s = streams.setdefault(name, Stream(name))
            if kind not in s.false_alarms or fa.hours >= s.false_alarms[kind].hours:
                s.false_alarms[kind] = fa
        elif header[:3] == LIFE_HEADER and len(cells) >= 12:
            name = _stream_name(cells[0])
            if name is None:
                continue
            s = streams.setdefault(name, Stream(name))
            s.false_alarms["life"] = FalseAlarms(_number(cells[7]), _number(cells[9]), _number(cells[11]), path.name)
            s.injected["slowdown_life"] = Injected(int(cells[2]), int(cells[3]), _number(cells[5]), float("nan"),
                                                   int(cells[4]), path.name)
        elif header[:6] == LIFE_DRIFT_HEADER and len(cells) >= 8 and cells[1] in LIFE_DRIFTS:
            name = _stream_name(cells[0])
            if name is None or (name, cells[1], cells[2]) in merged:
                continue
            merged.add((name, cells[1], cells[2]))
            s = streams.setdefault(name, Stream(name))
            found, starts = map(int, cells[4].split("/"))
            median, right = _number(cells[6]), int(cells[5])
            was = s.injected.get("drift_life")
            if was is not None and was.source == path.name:  # the stream's other change in this table: added
                found, starts, median, right = (found + was.found, starts + was.trials, max(was.median, median),
                                                right + was.expected)
            s.injected["drift_life"] = Injected(starts, found, median, float("nan"), right, path.name)
        elif header[:2] == ["before the change", "change"] and len(cells) >= 11 and cells[3].isdigit():
            name = _stream_name(cells[0])
            if name is None or int(cells[3]) == 0:
                continue
            expected = re.match(r"(\d+)/", cells[10])
            streams.setdefault(name, Stream(name)).injected[cells[1]] = Injected(
                int(cells[3]), int(cells[4]), _number(cells[6]), _number(cells[8]),
                int(expected.group(1)) if expected else 0, path.name)


def read_bound(path: Path, streams: dict[str, Stream]) -> None:
    """bound.py's fewest windows for the ITL mean's levels at the shared budget, per stream and change."""
    for header, cells in _tables(path.read_text().splitlines()):
        if header[0] != "stream" or "change" not in header:
            continue
        col = next(i for i, h in enumerate(header) if h.startswith("fewest windows, ITL mean"))
        name = TABLE_NAME.get(cells[0], cells[0])
        if name in streams:  # a stream of the tables given
            streams[name].bound[cells[header.index("change")]] = _number(cells[col])


@dataclass
class Verdict:
    false_alarms: str
    delay: str
    x2: str
    slowdowns: str


def verdict(s: Stream) -> Verdict:
    """Each goal met or not for one stream, with what says so (a goal with no row for it: no rows)."""
    fa = list(s.false_alarms.values())
    worst_events = max((f.events_per_day for f in fa), default=float("nan"))
    worst_episodes = max((f.episodes_per_day for f in fa), default=float("nan"))
    if not fa:
        fa_text = "no rows"
    elif worst_events <= GOAL_FA_PER_DAY:
        fa_text = "met"
    elif worst_episodes <= GOAL_FA_PER_DAY:
        fa_text = f"met as episodes ({worst_events:.2f} events a day)"
    else:
        fa_text = f"not met ({worst_episodes:.2f} episodes a day)"
    late = []
    for change in CHANGES:
        row = s.injected.get(change)
        if row is None or row.median <= GOAL_DELAY:  # nan (none found) is late
            continue
        bound = s.bound.get(BOUND_CHANGE.get(change, ""))
        reach = f", bound {bound:g}" if bound is not None else ""
        rise = f" ({row.from_rise:g} from the input's rise)" if row.from_rise == row.from_rise else ""
        late.append(f"{change} {row.median:g}{rise}{reach}")
    delay_text = ("met" if not late else "not met: " + "; ".join(late)) if s.injected else "no rows"
    x2_rows = {c: s.injected[c] for c in X2 if c in s.injected}
    missed = [f"{c} {r.found}/{r.trials}" for c, r in x2_rows.items() if r.found < r.trials]
    x2_text = ("met" if not missed else "not met: " + "; ".join(missed)) if x2_rows else "no rows"
    sl_rows = {c: s.injected[c] for c in SLOWDOWNS if c in s.injected}
    wrong = [f"{c} {r.expected}/{r.found}" for c, r in sl_rows.items() if r.expected < r.found]
    sl_text = ("met" if not wrong else "not met: " + "; ".join(wrong)) if sl_rows else "no rows"
    return Verdict(fa_text, delay_text, x2_text, sl_text)


def _fa_cell(s: Stream, kind: str) -> str:
    f = s.false_alarms.get(kind)
    return "-" if f is None else f"{f.events_per_day:.2f} / {f.episodes_per_day:.2f} ({f.hours:g} h)"


def _found_cell(s: Stream, change: str) -> str:
    r = s.injected.get(change)
    return "-" if r is None else f"{r.found}/{r.trials}, {r.median:g}"


def render(streams: dict[str, Stream], tables: list[Path], bounds: list[Path]) -> str:
    out = ["# Issue 24's goals, stream by stream", "",
           "command: `python experiments/detection/scoreboard.py --tables " + " ".join(p.name for p in tables)
           + (" --bound " + " ".join(p.name for p in bounds) if bounds else "") + "`", "",
           "False alarms: events / episodes a day (hours replayed), the row with the most hours of each replay; "
           "found: found / trials, median delay (windows); the verdicts: the goals (at most one false alarm a "
           "day, as events or else as episodes; a median delay of at most 2 windows for every injected change, "
           "with bound.py's fewest windows for a slowdown where it has one; no x2 missed; every slowdown found "
           "an anomaly, classified / found). A stream recorded with its server slowed several times in its own "
           "life (record_vllm.py --interleave): its real order outside the slowdowns, and its slowdowns found from "
           "every start in its lead (found / slowdowns watched, median delay); its traffic's inputs changed and "
           "back in the same life (record_vllm.py --life: found / changes watched, the latest of their median "
           "delays).", "",
           "| stream | bootstrap, window by window | blocks of 8 | real order from every start | real order of its "
           "life, outside its slowdowns | rate x2 | prompt x2 | output x4 | +30 % recorded | x1.3 model | x2 model | "
           "+30 % in its life | an input x2 / x4 and back in its life | throttle | false alarms | delay | x2 | "
           "slowdowns an anomaly |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    verdicts = {name: verdict(s) for name, s in streams.items()}
    for s in streams.values():
        v = verdicts[s.name]
        out.append("| " + " | ".join([
            s.name, _fa_cell(s, "window"), _fa_cell(s, "blocks"), _fa_cell(s, "real order"), _fa_cell(s, "life"),
            *(_found_cell(s, c) for c in CHANGES),
            v.false_alarms, v.delay, v.x2, v.slowdowns]) + " |")
    goals = ("false_alarms", "delay", "x2", "slowdowns")
    said = {g: [getattr(v, g) for v in verdicts.values() if getattr(v, g) != "no rows"] for g in goals}
    out += ["", "Goal met, of the streams with rows for it (false alarms, delay, x2, slowdowns an anomaly): "
            + ", ".join(f"{sum(v.startswith('met') for v in said[g])}/{len(said[g])}" for g in goals) + ".",
            "Sources: " + "; ".join(f"{s.name}: " + ", ".join(sorted(
                {f.source for f in s.false_alarms.values()} | {r.source for r in s.injected.values()}))
                for s in streams.values())]
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tables", nargs="+", type=Path, required=True, help="run.py tables, oldest first")
    ap.add_argument("--bound", type=Path, nargs="+", default=[], help="bound.py's tables")
    args = ap.parse_args()
    streams: dict[str, Stream] = {}
    for path in args.tables:
        read_table(path, streams)
    for path in args.bound:
        read_bound(path, streams)
    print(render(streams, args.tables, args.bound), end="")


if __name__ == "__main__":
    main()
