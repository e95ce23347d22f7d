"""`tuner worker`: join an agent's shared study from this host and run trials until its budget is spent."""


import json
import threading
from typing import Annotated

import typer

from tuner.cli.common import AgentArg, StateDirOpt, _install_stop_handlers, console, fail
from tuner.errors import TunerError


def register(app: typer.Typer) -> None:

    @app.command()
    def worker(
        agent_path: AgentArg,
        trials: Annotated[int | None, typer.Option(
            "--trials", "-n", min=1, help="Trials the shared study should hold (default: the agent's "
            "budget.trials), counted over every worker.")] = None,
        state_dir: StateDirOpt = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print this worker's summary as JSON.")] = False,
    ) -> None:
        """Join the agent's study (a shared database) and run its trials with the other workers until the
        budget is spent. Start one per host; Ctrl-C ends this worker's running trial as interrupted."""
        from tuner.context import open_context
        from tuner.fleet.worker import run_worker
        from tuner.loop import TrialOutcome
        from tuner.tracking.tracker import safe_url

        try:
            ctx = open_context(agent_path, state_dir)
            agent = ctx.agent
            session = ctx.session()  # the study the agent's lineage names, as every command
            stop = threading.Event()
            _install_stop_handlers(stop)
            if not as_json:
                console.print(f"[bold]{agent.name}[/]: worker on study {session.study.name} "
                              f"({safe_url(session.study.storage_url)})", highlight=False)

            def on_trial(o: TrialOutcome) -> None:
                if as_json:
                    return
                what = o.cause or f"{agent.spec.objectives[0].metric}={o.values[0]:.4g}"
                console.print(f"  trial {o.number}: {what}", highlight=False)

            result = run_worker(session, trials=trials, stop_event=stop, on_trial=on_trial)
        except TunerError as exc:
            raise fail(exc) from None
        summary = {"agent": agent.name, "study": session.study.name, "budget": result.budget,
                   "study_trials": result.counted, "trials_run": [o.number for o in result.outcomes],
                   "failed": {o.number: o.cause for o in result.outcomes if o.cause},
                   "stopped": result.stopped, "wall_s": round(result.wall_s, 3), "fleet_run": result.run_id}
        if as_json:
            console.print_json(json.dumps(summary))
        else:
            console.print(f"this worker ran {len(result.outcomes)} trial(s); the study holds {result.counted} "
                          f"of {result.budget or 'unbounded'}" + (" (stopped)" if result.stopped else ""))



