"""Operator commands: `tuner daemon`, `check`, `promote`, `rollout`, `rollback`, `history`.

`register(app)` adds them to the lead's typer app. `python -m tuner.cli.ops ...` runs them alone.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

from tuner.base.logs import configure_logging
from tuner.base.redact import redact_text
from tuner.errors import TunerError


def _fail(exc: TunerError) -> typer.Exit:
    typer.echo(f"error: {redact_text(str(exc))}", err=True)
    return typer.Exit(getattr(exc, "exit_code", 1))


def _logging() -> None:
    configure_logging()  # a no-op under `tuner` (its callback set logging up)


AGENT_HELP = "agent spec file (default: the one agent the state dir holds)"


def _fmt_time(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def daemon(agents: list[Path] = typer.Argument(..., help="agent spec files"),
           state_dir: Path | None = typer.Option(None, "--state-dir", help="state directory (default .tuner)"),
           port: int = typer.Option(8787, "--port", help="health/metrics port on 127.0.0.1 (0: any free, -1: off)"),
           grace_s: float = typer.Option(30.0, "--grace-s", help="seconds to tear down on SIGTERM")) -> None:
    """Run PDCA cycles on each agent's schedule until SIGTERM.

    Every cycle reads its agent file afresh; SIGHUP (`kill -HUP`, `systemctl reload`) also applies a changed
    schedule or watch without a restart.
    """
    from tuner.context import state_dir_for
    from tuner.daemon.scheduler import run_daemon

    _logging()
    try:
        rc = run_daemon(agents, state_dir_for(state_dir), port=None if port < 0 else port, grace_s=grace_s)
    except TunerError as exc:
        raise _fail(exc) from None
    raise typer.Exit(rc)


def check(url: str | None = typer.Option(None, "--url", help="the daemon's endpoint, e.g. http://127.0.0.1:8787"),
          state_dir: Path | None = typer.Option(None, "--state-dir"),
          max_age_s: float | None = typer.Option(None, "--max-age-s", help="oldest acceptable heartbeat"),
          as_json: bool = typer.Option(False, "--json", help='{"ok": ..., "reason": ...} on stdout')) -> None:
    """Exit 0 when the daemon is alive and its last cycle did not fail, 1 otherwise."""
    from tuner.context import state_dir_for
    from tuner.daemon.health import check_alive

    ok, why = check_alive(url=url, state_dir=state_dir_for(state_dir, create=False) if url is None else None,
                          max_age_s=max_age_s)
    if as_json:
        typer.echo(json.dumps({"ok": ok, "reason": why}))
    else:
        typer.echo(("ok: " if ok else "not ok: ") + why, err=not ok)
    raise typer.Exit(0 if ok else 1)


def promote(agent: Path | None = typer.Argument(None, help=AGENT_HELP, show_default=False),
            trial: int | None = typer.Option(None, "--trial", help="trial number (default: pending, else best)"),
            yes: bool = typer.Option(False, "--yes", "-y", help="do not ask for confirmation"),
            skip_verify: bool = typer.Option(False, "--skip-verify", help="promote without A/B verification"),
            reverify: bool = typer.Option(False, "--reverify", help="verify even a verified pending candidate"),
            reason: str = typer.Option("", "--reason", help="recorded in the audit log"),
            state_dir: Path | None = typer.Option(None, "--state-dir"),
            as_json: bool = typer.Option(False, "--json", help="the new champion as JSON (needs --yes)"),
            canary: bool = typer.Option(False, "--canary", help="promote through a canary rollout on live traffic "
                                        "(the agent's rollout: section; same as `tuner rollout`)")) -> None:
    """Verify a candidate against the champion, then make it the champion (file, apply, MLflow, audit)."""
    from tuner.context import open_context
    from tuner.loop import finish_tracking
    from tuner.promotion.act import promote_trial

    _logging()
    try:
        session = open_context(agent, state_dir).session()  # the study the lineage names
        promote_via = None
        if canary:
            from tuner.rollout.rollout import canary_promoter, recover_agent

            recover_agent(session)  # a rollout a killed command left: reverted first
            promote_via = canary_promoter(session)
        if skip_verify:
            typer.secho("WARNING: promoting WITHOUT verification (--skip-verify); this is recorded in the audit "
                        "log", fg=typer.colors.RED, err=True, bold=True)

        if as_json and not yes:
            raise TunerError("--json needs --yes (no question can be asked)")

        def confirm(msg: str) -> bool:
            if as_json:
                return True
            typer.echo(msg)
            return yes or typer.confirm("Promote?", default=False)

        try:
            res = promote_trial(session, trial=trial, skip_verify=skip_verify, reverify=reverify, confirm=confirm,
                                reason=reason, promote=promote_via)
        finally:  # a verification MLflow missed is written now if it answers again, else at the next start
            finish_tracking(session)
            if canary and not as_json:
                _print_rollout(session)
    except TunerError as exc:
        result = getattr(exc, "result", None)
        if canary and as_json and result is not None:  # a canary rolled back
            typer.echo(json.dumps({"action": "rolled_back", **result.summary()}, default=str))
            raise typer.Exit(1) from None
        raise _fail(exc) from None
    r = res.record
    if as_json:
        typer.echo(json.dumps({"action": "promoted", "agent": r.agent, "seq": r.seq, "trial": r.trial,
                               "study": r.study, "values": r.values, "verified": r.verified,
                               "model_version": r.model_version, "evidence": r.evidence,
                               "verdict": res.verdict.summary() if res.verdict is not None else None,
                               "champion_file": str(session.state_dir / r.agent / "champion.yaml")}, default=str))
        return
    typer.echo(f"promoted trial {r.trial} of {r.agent} as champion #{r.seq}"
               + (f" (MLflow {r.model_name} v{r.model_version})" if r.model_version else "")
               + f": {session.state_dir / r.agent / 'champion.yaml'}")


def _print_rollout(session: object) -> None:
    """The stages of the agent's latest rollout, one line each (from the audit log)."""
    from tuner.champions.db import champion_store
    from tuner.rollout.rollout import last_rollout

    for e in last_rollout(champion_store(session)):
        if e.get("action") == "rollout_stage":
            figs = "  ".join(f"{k.split(':')[0]} {v:+.1%}" for k, v in (e.get("figures") or {}).items())
            typer.echo(f"  stage {e.get('stage')} {e.get('percent'):g}%  {e.get('outcome')}  "
                       f"{e.get('duration_s', 0):.0f}s  canary {e.get('canary_requests', 0):.0f} req "
                       f"({e.get('canary_slo_breaking', 0):.0f} over an SLO)  {figs}")
        elif str(e.get("action")).startswith(("rollout_promoted", "rollout_rolled_back")):
            typer.echo(f"  {e['action'].removeprefix('rollout_')}: {e.get('reason')}")


def rollout(agent: Path | None = typer.Argument(None, help=AGENT_HELP, show_default=False),
            trial: int | None = typer.Option(None, "--trial", help="trial number (default: pending, else best)"),
            yes: bool = typer.Option(False, "--yes", "-y", help="do not ask for confirmation"),
            skip_verify: bool = typer.Option(False, "--skip-verify", help="roll out without A/B verification"),
            reverify: bool = typer.Option(False, "--reverify", help="verify even a verified pending candidate"),
            reason: str = typer.Option("", "--reason", help="recorded in the audit log"),
            state_dir: Path | None = typer.Option(None, "--state-dir"),
            recover: bool = typer.Option(False, "--recover", help="only revert a rollout a killed process left"),
            as_json: bool = typer.Option(False, "--json", help="the outcome as JSON (needs --yes)")) -> None:
    """Promote a candidate through a canary rollout: staged traffic through the load balancer, judged on live
    traffic against the stable replicas, rolled back automatically (the agent's rollout: section)."""
    if not recover:
        promote(agent=agent, trial=trial, yes=yes, skip_verify=skip_verify, reverify=reverify, reason=reason,
                state_dir=state_dir, as_json=as_json, canary=True)
        return
    from tuner.context import open_context
    from tuner.rollout.rollout import recover_agent

    _logging()
    try:
        entry = recover_agent(open_context(agent, state_dir).session())
    except TunerError as exc:
        raise _fail(exc) from None
    if as_json:
        typer.echo(json.dumps({"recovered": entry}, default=str))
    else:
        typer.echo(entry["reason"] if entry else "no interrupted rollout")


def rollback(agent: Path | None = typer.Argument(None, help=AGENT_HELP, show_default=False),
             yes: bool = typer.Option(False, "--yes", "-y"),
             reason: str = typer.Option("operator rollback", "--reason"),
             state_dir: Path | None = typer.Option(None, "--state-dir"),
             as_json: bool = typer.Option(False, "--json", help="the restored champion as JSON (needs --yes)")) -> None:
    """Restore the previous champion (file, apply command, MLflow aliases, audit)."""
    from tuner.champions.db import champion_store_for
    from tuner.context import open_context
    from tuner.promotion.act import rollback as do_rollback

    _logging()
    try:
        ctx = open_context(agent, state_dir)
        a, sd = ctx.agent, ctx.state_dir
        store = champion_store_for(a, sd)
        cur = store.champion_in_force() if hasattr(store, "champion_in_force") else store.champion()
        if cur is None or cur.previous_seq is None:
            raise TunerError(f"{a.name} has no previous champion to restore")
        if as_json and not yes:
            raise TunerError("--json needs --yes (no question can be asked)")
        if not yes and not typer.confirm(f"Replace champion #{cur.seq} (trial {cur.trial}) of {a.name} by "
                                         f"#{cur.previous_seq}?", default=False):
            raise TunerError("rollback cancelled")
        res = do_rollback(store, ctx.tracker(), apply_command=a.spec.promotion.apply_command, cwd=a.path.parent,
                          reason=reason)
    except TunerError as exc:
        raise _fail(exc) from None
    if as_json:
        typer.echo(json.dumps({"action": "rolled_back", "agent": a.name, "seq": res.record.seq,
                               "trial": res.record.trial, "study": res.record.study}, default=str))
        return
    typer.echo(f"rolled back {a.name}: champion #{res.record.seq} (trial {res.record.trial}) restored")


def history(agent: Path | None = typer.Argument(None, help=AGENT_HELP, show_default=False),
            as_json: bool = typer.Option(False, "--json", help="one JSON object: cycles, verifications, promotions, "
                                         "events"),
            state_dir: Path | None = typer.Option(None, "--state-dir")) -> None:
    """List the agent's cycles, verifications, promotions and production monitor events."""
    from tuner.context import open_context
    from tuner.promotion.audit import history as get_history
    from tuner.scenarios.store import ScenarioBook
    from tuner.scenarios.table import traffic_text

    try:
        ctx = open_context(agent, state_dir, create=False)  # reads only: creates no store
        a, sd = ctx.agent, ctx.state_dir
        from tuner.champions.db import champion_store_for

        h = (get_history(sd, a.name, ctx.read_tracker(), champion_store_for(a, sd)) if ctx.has_state()
             else {"cycles": [], "verifications": [], "promotions": []})
        from tuner.monitor.records import read_events

        h["events"] = read_events(sd, a.name) if ctx.has_state() else []
        h["switches"] = ScenarioBook(sd, a.name).switches()
    except TunerError as exc:
        raise _fail(exc) from None
    if as_json:
        typer.echo(json.dumps(h, indent=2, sort_keys=True, default=str))
        return
    typer.echo(f"{a.name}: {len(h['cycles'])} cycle(s), {len(h['verifications'])} verification(s), "
               f"{len(h['promotions'])} promotion event(s), {len(h['events'])} monitor event(s)")
    typer.echo("cycles:")
    for c in h["cycles"]:
        typer.echo(f"  #{c.get('cycle')}  {_fmt_time(c.get('start_time'))}  {c.get('status', c.get('outcome'))}"
                   f"  trials={c.get('trials_run', len(c.get('trials', []) or []))}  best={c.get('best_value')}"
                   f"  tuned for: {traffic_text(c)}")
    typer.echo("verifications:")
    for v in h["verifications"]:
        typer.echo(f"  {_fmt_time(v.get('time'))}  trial {v.get('trial')} vs {v.get('reference')}: "
                   f"{'PASS' if v.get('passed') else 'FAIL'}  {v.get('reason')}")
    typer.echo("promotions:")
    for p in h["promotions"]:
        typer.echo(f"  {_fmt_time(p.get('time'))}  {p.get('action')}  #{p.get('seq')} trial {p.get('trial')} "
                   f"by {p.get('user')}: {p.get('reason')}")
    typer.echo("monitor events:")
    for e in h["events"]:
        answer = (e.get("response") or {}).get("action")
        typer.echo(f"  {_fmt_time(e.get('time'))}  {e.get('kind')}{' (reopened)' if e.get('reopened') else ''}"
                   f" ({e.get('cause')}): {e.get('detail')}"
                   + (f"  -> {answer}" if answer else ""))
    if h["switches"]:
        typer.echo("scenario switches and requests:")
        for e in h["switches"]:
            typer.echo(f"  {_fmt_time(e.get('time'))}  {e.get('kind')} {e.get('scenario') or ''}"
                       f"{'  #' + str(e['seq']) if e.get('seq') is not None else ''}: {e.get('reason')}")


def register(app: typer.Typer) -> None:
    """Add the operator commands to `app`."""
    app.command("daemon")(daemon)
    app.command("check")(check)
    app.command("promote")(promote)
    app.command("rollout")(rollout)
    app.command("rollback")(rollback)
    app.command("history")(history)


def main() -> None:
    configure_logging()
    app = typer.Typer(add_completion=False, no_args_is_help=True)
    register(app)
    app()


if __name__ == "__main__":
    main()
