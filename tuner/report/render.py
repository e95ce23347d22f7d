"""A report as one self-contained HTML file (plots inlined as PNG data URIs, no script or style fetched) and as
a short Markdown summary for a pull request or a ticket."""

from __future__ import annotations

import base64
from collections import Counter
from typing import Any

import yaml

from tuner.base.textfmt import fmt, when
from tuner.report.data import ReportData, TrialRow
from tuner.scenarios.table import gain_text, stats_text

PLOT_CAPTIONS = {
    "optimization_history": "Optimisation history (measured trials)",
    "parallel_coordinates": "Parallel coordinates",
    "param_importances": "Parameter importance (Optuna)",
    "pareto_front": "Pareto front (infeasible trials greyed)",
    "slo_feasibility": "SLO feasibility map (failed trials at their parameters)",
}


def changed_params(d: ReportData, row: TrialRow) -> str:
    base = d.baseline
    if base is None or row is base:
        return "defaults" if row.baseline else _params(row.params)
    diff = {k: v for k, v in row.params.items() if base.params.get(k) != v}
    text = _params(diff) if diff else "same as the baseline"
    return f"candidate {row.candidate}: {text}" if row.candidate else text


def _params(p: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in p.items())


def knob_split(d: ReportData, row: TrialRow) -> tuple[list[str], list[str]]:
    """The trial's knobs as `name=value` (numbers to 4 significant digits): (changed from the baseline, the
    rest). The baseline's are all 'the rest'."""
    base = d.baseline.params if d.baseline is not None and not row.baseline else None
    changed: list[str] = []
    rest: list[str] = []
    for k, v in row.params.items():
        (changed if base is not None and base.get(k) != v else rest).append(knob_text(k, v))
    return changed, rest


def knob_text(name: str, value: Any) -> str:
    return f"{name}={fmt(value) if isinstance(value, float) else value}"


def _cards(d: ReportData) -> list[tuple[str, TrialRow | None, str]]:
    champ = d.champion
    if champ is None:
        champ_note = "no champion yet (tuner promote)"
    else:
        champ_note = (f"champion #{champ['seq']}, promoted {when(champ.get('promoted_at'))} by {champ.get('user')}"
                      + ("" if champ.get("verified") else " WITHOUT verification"))
        if d.champion_row is None:
            champ_note += f" (trial {champ.get('trial')} of study {champ.get('study')})"
    best = d.best[0] if d.best else None
    return [("baseline", d.baseline, "" if d.baseline else "the baseline has not been measured"),
            ("champion", d.champion_row, champ_note),
            ("best", best, "" if best else "no feasible trial yet")]


def html(d: ReportData) -> str:
    import jinja2
    import markupsafe

    env = jinja2.Environment(loader=jinja2.PackageLoader("tuner.report", "templates"),
                             autoescape=jinja2.select_autoescape(["html", "j2"]), undefined=jinja2.StrictUndefined)
    plots = [(name, PLOT_CAPTIONS.get(name, name), "data:image/png;base64," + base64.b64encode(data).decode())
             for name, data in d.plots.items()]
    objective_names = [o["metric"] for o in d.objectives]
    table_metrics = [k for k in d.key_metrics if k not in objective_names]

    def last_error(cause: str) -> str:
        for r in reversed(d.rows):
            if r.cause == cause and r.error:
                return f"trial {r.number}: {r.error[:300]}"
        return ""

    matrix_time = next((r["matrix_time"] for r in d.scenarios if r.get("matrix_time")), None)
    confidence = next((f"{c:.0%}" for c in [d.scenario_confidence] if c), "95%")
    return env.get_template("report.html.j2").render(
        d=d, fmt=fmt, when=when, plots=plots, cards=_cards(d), objective_names=objective_names,
        scenarios=d.scenarios, matrix_time=matrix_time, confidence=confidence, gain=gain_text,
        knobs=lambda p: [knob_text(k, v) for k, v in p.items()],
        traffic=stats_text,
        table_metrics=table_metrics, changed=lambda r: changed_params(d, r), params=lambda r: _params(r.params),
        knob_diff=lambda r: knob_split(d, r)[0], knob_rest=lambda r: knob_split(d, r)[1],
        wbr=lambda name: markupsafe.Markup("_<wbr>").join(str(name).split("_")),  # headers break at underscores
        last_error=last_error, generated=when(d.generated_at),
        n_infeasible=sum(r.state == "infeasible" for r in d.rows),
        n_failed=sum(r.state in ("failed", "interrupted") for r in d.rows),
        workload_yaml=yaml.safe_dump(d.workload, sort_keys=False))


def markdown(d: ReportData) -> str:
    """A summary that fits a PR description: headline, the three configurations, failures, the last verdicts."""
    obj = d.objectives[0]
    lines = [f"## Tuning report: {d.agent}", "",
             f"Study `{d.study}`, target `{d.target.get('kind')}`"
             + "".join(f", {k} `{v}`" for k, v in d.target_description.items())
             + f"; generated {when(d.generated_at)}.",
             "",
             f"{len(d.rows)} trials: {d.counts.get('FEASIBLE', 0)} feasible, "
             f"{sum(r.state == 'infeasible' for r in d.rows)} breaking an SLO, "
             f"{sum(r.state in ('failed', 'interrupted') for r in d.rows)} failed. "
             f"Objective: {obj['metric']} ({obj['direction']}); SLOs: "
             + (", ".join(f"`{s[4:]}`" for s in d.slos) or "none") + ".", "",
             f"| | trial | {obj['metric']} | vs baseline | parameters changed from the baseline |",
             "|---|---:|---:|---:|---|"]
    for label, row, note in _cards(d):
        if row is None:
            lines.append(f"| {label} | - | - | - | {note} |")
        else:
            v = fmt(row.values[0]) if row.values else "-"
            lines.append(f"| {label} | {row.number} | {v} | {d.vs_baseline(row)} | {changed_params(d, row)} |")
    if d.failures:
        lines += ["", "Failures by cause: " + ", ".join(f"{c} {n}" for c, n in d.failures.items()) + "."]
    if d.verifications:
        ver = d.verifications[-1]
        lines += ["", f"Last verification ({when(ver.get('time'))}): trial {ver.get('trial')} vs "
                      f"{ver.get('reference')}: {'PASS' if ver.get('passed') else 'FAIL'}, {ver.get('reason')}."]
    if d.promotions:
        e = d.promotions[-1]
        lines += ["", f"Last promotion event ({when(e.get('time'))}): {e.get('action')} #{e.get('seq')} "
                      f"(trial {e.get('trial')}) by {e.get('user')}: {e.get('reason')}."]
    if d.scenarios:
        lines += ["", "| scenario | region | champion (changed knobs) | gain over the baseline |", "|---|---|---|---:|"]
        for r in d.scenarios:
            ch = r["champion"]
            champ = (f"#{ch['seq']} trial {ch['trial']}: {_params(ch['changed']) or 'the baseline'}" if ch
                     else "none yet")
            lines.append(f"| {r['scenario']}{' (in service)' if r['in_service'] else ''} | {r['bounds']} | {champ} | "
                         f"{gain_text(r['gain_vs_baseline'])} |")
    if d.events:
        kinds = Counter(str(e.get("kind")) for e in d.events)
        reopened = sum(1 for e in d.events if e.get("reopened"))
        e = d.events[-1]
        lines += ["", "Production monitor: " + ", ".join(f"{n} {k}" for k, n in kinds.items())
                  + (f" ({reopened} of them reopened an episode that had just recovered)" if reopened else "")
                  + f"; last ({when(e.get('time'))}): {e.get('detail')}."]
    return "\n".join(lines) + "\n"
