"""`tuner status` as text: a summary line and tables (local times, readable numbers), never raw dicts."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from tuner.base.textfmt import age, fmt, params_text, when
from tuner.scenarios.table import gain_text, stats_text


def _values(t: dict[str, Any]) -> str:
    if t.get("cause"):
        return f"failed: {t['cause']}"
    return ", ".join(fmt(v) for v in (t.get("values") or [])) or "-"


def print_status(console: Console, data: dict[str, Any]) -> None:
    c = data["trials"]
    rejected = f", {c['REJECTED']} rejected proposals" if c.get("REJECTED") else ""
    rejected += f", {c['SCREENED']} proposals screened by the simulator" if c.get("SCREENED") else ""
    rejected += f", {c['REPEATS']} repeats of a configuration proposed again" if c.get("REPEATS") else ""
    console.print(f"[bold]{data['agent']}[/] (study {data['study']}): {c.get('COMPLETE', 0)} finished "
                  f"({c.get('FEASIBLE', 0)} feasible, {c.get('INFEASIBLE', 0)} infeasible{rejected}), "
                  f"{c.get('FAIL', 0)} failed/interrupted, "
                  + (f"{c['PRUNED']} pruned (stopped early, an SLO broken by far), " if c.get("PRUNED") else "")
                  + f"{c.get('RUNNING', 0)} running, "
                  f"{c.get('WAITING', 0)} waiting", highlight=False)
    rows = [("baseline", data.get("baseline"))] + [("best", b) for b in data.get("best") or []]
    table = Table(title="trials")
    for col, justify in (("", "left"), ("trial", "right"), ("objective value(s)", "right"),
                         ("feasible", "left"), ("parameters", "left")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for label, t in rows:
        if t:
            table.add_row(label, str(t["number"]), _values(t), "yes" if t.get("feasible") else "no",
                          params_text(t.get("params") or {}))
    console.print(table)
    champ = data.get("champion")
    if champ:
        ct = Table(title="champion")
        for col in ("#", "trial", "study", "value(s)", "promoted", "age", "by", "verified", "MLflow version"):
            ct.add_column(col)
        ct.add_row(str(champ.get("seq")), str(champ.get("trial")), str(champ.get("study")),
                   ", ".join(fmt(v) for v in champ.get("values") or []), when(champ.get("promoted_at")),
                   age(champ.get("age_s")), str(champ.get("user") or "-"), "yes" if champ.get("verified") else "NO",
                   str(champ.get("model_version") or "-"))
        console.print(ct)
        console.print(f"  champion config: {params_text(champ.get('config') or {})}", highlight=False)
    else:
        console.print("  champion: none yet (tuner promote)", highlight=False)
    pending = data.get("pending")
    if pending:
        console.print(f"  pending candidate: trial {pending.get('trial')} of {pending.get('study')}, verified "
                      f"{when(pending.get('created_at') or pending.get('time'))}: "
                      f"{'PASS' if pending.get('passed') else 'FAIL'} ({pending.get('reason', '')}); "
                      "`tuner promote` to apply it", highlight=False)
    if data.get("workload_rate"):
        from tuner.study.sizing import RateSizing

        sized = RateSizing.from_attr(data["workload_rate"])
        console.print(f"  workload rate: {sized.describe() if sized else data['workload_rate']}", highlight=False)
    last = data.get("last_cycle")
    if last:
        console.print(f"  last cycle: #{last.get('cycle')} ended {when(last.get('ended_at'))}, "
                      f"{last.get('trials')} trial(s) in {fmt(last.get('wall_s'))} s"
                      + (", interrupted" if last.get("interrupted") else "")
                      + (f", MLflow run {last['run_id']}" if last.get("run_id") else ""), highlight=False)
    if data.get("scenarios"):
        print_scenarios(console, data["scenarios"])


def print_scenarios(console: Console, scenarios: list[dict[str, Any]]) -> None:
    """The scenario table (tuner.scenarios.table.scenario_rows)."""
    if scenarios:
        st = Table(title="scenarios (gains on each scenario's own traffic, [interval])")
        for col in ("scenario", "region", "champion: knobs changed from the baseline", "traffic tuned for",
                    "over the baseline", *[f"over {s['scenario']}" for s in scenarios]):
            st.add_column(col)
        for s in scenarios:
            ch = s.get("champion")
            stats = (s.get("workload") or {}).get("stats") or {}
            st.add_row(s["scenario"] + (" (in service)" if s.get("in_service") else ""), s["bounds"],
                       (f"#{ch['seq']} trial {ch['trial']}: {params_text(ch['changed']) or 'the baseline'}" if ch
                        else "none yet"),
                       stats_text(stats) or "-",
                       gain_text(s.get("gain_vs_baseline")),
                       *["-" if o["scenario"] == s["scenario"] else gain_text((s.get("gain_vs") or {}).get(
                           o["scenario"])) for o in scenarios])
        console.print(st)
