"""Loading an agent: its spec file, the search space it names, its target's options, its files.

This is the layer above the spec schemas and the targets: it reads YAML, validates the spec (tuner.spec), the
target's options (the target kind's own model) and the search space, and raises a located ConfigError.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from tuner import catalog
from tuner.base.files import regular_file_problem
from tuner.base.redact import redact_mapping, redact_text
from tuner.base.yamlio import Loc, line_of, load_yaml, pydantic_to_config_error
from tuner.errors import ConfigError
from tuner.search.samplers import SAMPLER_NAMES
from tuner.search.space import SearchSpace, load_space, parse_space
from tuner.spec import AgentSpec
from tuner.targets.base import Target, TrialContext
from tuner.targets.process import format_command
from tuner.targets.registry import make_target, validate_target_options


class Agent(BaseModel):
    """A loaded agent: its spec, where it came from, its resolved search space and its target's options."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    spec: AgentSpec
    path: Path
    space: SearchSpace
    target_options: BaseModel  # an instance of the target kind's Options model

    @property
    def name(self) -> str:
        return self.spec.name

    def resolve(self, rel: str) -> Path:
        """A path named in the spec, relative to the agent file."""
        p = Path(rel)
        return p if p.is_absolute() else (self.path.parent / p)


def load_agent(path: str | Path) -> Agent:
    """Load and validate an agent spec and everything it names. Raises a located ConfigError."""
    path = Path(path)
    data, lines = load_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError("an agent spec must be a YAML mapping", file=str(path), line=1)
    try:
        spec = AgentSpec.model_validate(data)
    except ValidationError as exc:
        raise pydantic_to_config_error(exc, str(path), lines) from None
    _check_registries(spec, str(path), lines)
    check_metrics(spec, str(path), lines)
    target_options = validate_target_options(spec.target, file=str(path), lines=lines)
    if isinstance(spec.search_space, str):
        sp = Path(spec.search_space)
        sp = sp if sp.is_absolute() else path.parent / sp
        space = load_space(sp)
    else:
        space = parse_space(spec.search_space, file=str(path), lines=lines, prefix=("search_space",))
    agent = Agent(spec=spec, path=path, space=space, target_options=target_options)
    _check_files(agent, lines)
    _check_candidates(agent, lines)
    return agent


def _check_candidates(agent: Agent, lines: dict[Loc, int]) -> None:
    """Every candidate is a configuration of the search space (its knobs, their ranges, the constraints)."""
    for i, cand in enumerate(agent.spec.candidates):
        _, problems = agent.space.point(cand.params)
        if problems:
            knob, rule = problems[0]
            loc: Loc = ("candidates", i, "params", knob) if knob else ("candidates", i, "params")
            raise ConfigError(f"candidate {cand.name!r}: {knob + ': ' if knob else ''}{rule}",
                              file=str(agent.path), line=line_of(lines, loc) or line_of(lines, ("candidates", i)),
                              field=f"candidates[{i}].params" + (f".{knob}" if knob else ""))


def _check_registries(spec: AgentSpec, file: str, lines: dict[Loc, int]) -> None:
    """Names the spec picks from a registry (the sampler) exist."""
    if spec.sampler.name not in SAMPLER_NAMES:
        raise ConfigError(f"unknown sampler {spec.sampler.name!r}; valid: {', '.join(SAMPLER_NAMES)}", file=file,
                          line=line_of(lines, ("sampler", "name")) or line_of(lines, ("sampler",)),
                          field="sampler.name")


def check_metrics(spec: AgentSpec, file: str | None = None, lines: dict[Loc, int] | None = None) -> None:
    """Every metric the objectives and SLOs name is in the catalog, and the catalog's rules hold."""
    lines = lines or {}
    named = [("objectives", i, o.metric) for i, o in enumerate(spec.objectives)]
    named += [("slos", i, s.metric) for i, s in enumerate(spec.slos)]

    def error(msg: str, kind: str, i: int) -> ConfigError:
        line = line_of(lines, (kind, i, "metric")) if lines else None
        return ConfigError(msg, file=file, line=line, field=f"{kind}[{i}].metric")

    for kind, i, metric in named:
        msg = catalog.unknown_message(metric)
        if msg is not None:
            raise error(msg, kind, i)
    if not spec.workload.stream:
        for kind, i, metric in named:
            row = catalog.lookup(metric)
            if row is not None and row.streamed_only:
                raise error(f"{metric} is measured only on streamed responses, and workload.stream is false: "
                            "stream the workload or use e2el_ms", kind, i)
    if spec.rollout is not None and spec.rollout.metrics is not None:
        for i, metric in enumerate(spec.rollout.metrics):
            if metric == "goodput_fraction" or catalog.server_key(metric) is not None:
                continue
            line = line_of(lines, ("rollout", "metrics", i)) if lines else None
            why = catalog.unknown_message(metric) or "the servers' /metrics do not export it"
            raise ConfigError(f"rollout.metrics: {metric!r} cannot be judged on live traffic ({why}); judged are "
                              "goodput_fraction and the latencies with a server series (ttft_ms.*, itl_ms.*, "
                              "e2el_ms.mean/p99)", file=file, line=line, field=f"rollout.metrics[{i}]")
    _check_rate_objective(spec, file, lines)
    latency_slos = [s for s in spec.slos if s.max is not None and catalog.is_latency(s.metric)]
    for i, o in enumerate(spec.objectives):
        row = catalog.lookup(o.metric)
        if row is not None and row.needs_latency_slo and not latency_slos:
            bases = ", ".join(m.name for m in catalog.CATALOG.values() if m.latency)
            raise error(f"objective {o.metric} counts requests that meet the latency SLOs: add at least one slo "
                        f"on {bases} with a max", "objectives", i)


RATE_OBJECTIVE = "max_rate_under_slo"


def _check_rate_objective(spec: AgentSpec, file: str | None, lines: dict[Loc, int]) -> None:
    """The rules of the `max_rate_under_slo` objective (a capacity search per trial, tuner.study.rate_objective)."""
    def error(msg: str, kind: str, i: int, key: str = "metric") -> ConfigError:
        return ConfigError(msg, file=file, line=line_of(lines, (kind, i, key)),
                           field=f"{kind}[{i}].{key}")

    for i, s in enumerate(spec.slos):
        if s.metric == RATE_OBJECTIVE:
            raise error(f"{RATE_OBJECTIVE} is what a trial's capacity search finds, not a measured metric: use it as "
                        "an objective (objectives: [{metric: max_rate_under_slo, direction: maximize}])", "slos", i)
    for i, o in enumerate(spec.objectives):
        if o.metric != RATE_OBJECTIVE:
            if o.search is not None:
                raise error(f"search bounds the capacity search of {RATE_OBJECTIVE}; objective {o.metric} has "
                            "none: remove it", "objectives", i, "search")
            continue
        rule = None
        if o.direction != "maximize":
            rule = f"{RATE_OBJECTIVE} is a rate to maximise: direction: maximize"
        elif not any(s.max is not None for s in spec.slos):
            rule = (f"{RATE_OBJECTIVE} is the highest rate meeting the upper-bound SLOs: add at least one slo with "
                    "a max (e.g. {metric: ttft_ms.p99, max: 500})")
        elif spec.workload.arrival.kind == "trace":
            rule = f"{RATE_OBJECTIVE} probes the workload at rates of its own: a trace's arrivals cannot be re-rated"
        elif spec.workload.auto_rate:
            rule = (f"{RATE_OBJECTIVE} searches the rate per trial: workload.arrival.rate_per_s: auto (one rate "
                    "sized for the study) contradicts it; give a fixed rate_per_s or a closed loop")
        elif spec.executor.kind != "local":
            rule = f"{RATE_OBJECTIVE} runs its capacity search on the local executor only (executor.kind: local)"
        if rule is not None:
            raise error(rule, "objectives", i)


def _check_files(agent: Agent, lines: dict[Loc, int]) -> None:
    w = agent.spec.workload
    for field, value in (("workload.dataset", w.dataset), ("workload.arrival.trace", w.arrival.trace)):
        problem = regular_file_problem(agent.resolve(value)) if value else None
        if value and problem:
            loc = tuple(field.split("."))
            raise ConfigError(
                f"{problem}: {agent.resolve(value)}",
                file=str(agent.path),
                line=line_of(lines, loc),
                field=field,
            )


def bind_target(agent: Agent, target: Target) -> SearchSpace:
    """The agent's space bound to the target's host facts and accepted by the target (its knobs, its command
    template): the checks `run` makes before its first trial. Raises a located ConfigError."""
    space = agent.space.bind_facts(target.facts()).bind_resources(target.resource_violations)
    try:
        target.check_space(space)  # also tells the target the space's defaults (flags left out at them)
        if agent.spec.sampler.screen is not None:
            from tuner.sim.refcost import load_screen_model

            load_screen_model(agent.spec.sampler.screen, agent.path.parent, agent.spec.target.kind)
    except ConfigError as exc:
        raise locate(exc, agent) from None
    return space


def preflight(agent: Agent) -> tuple[Target, SearchSpace]:
    """Build the agent's target and bind its space (bind_target), opening no store: what `validate` runs."""
    try:
        target = make_target(agent.spec.target.kind, agent.target_options, agent.path.parent)
    except ConfigError as exc:
        raise locate(exc, agent) from None
    return target, bind_target(agent, target)


def locate(exc: ConfigError, agent: Agent) -> ConfigError:
    """`exc` with the file and line of its field (a target's errors name a field, not where it is written)."""
    if exc.line is not None:
        return exc
    file = exc.file or str(agent.path)
    field = exc.field
    if field and file == str(agent.path) and field.startswith("params.") and not isinstance(
            agent.spec.search_space, str):
        field = "search_space." + field  # an inline space
    try:
        _, lines = load_yaml(Path(file))
    except (ConfigError, OSError):
        lines = {}
    line = line_of(lines, tuple(field.split("."))) if field else None
    return ConfigError(exc.raw_message, file=file, line=line, field=field)


def show_command(agent: Agent) -> str:
    """The exact argv and environment the agent's baseline trial would launch (or a note if none)."""
    target, space = preflight(agent)
    params = space.full_config(space.defaults())
    n = target.gpus_needed(params)
    pool = list(agent.spec.gpus) if agent.spec.gpus else list(range(n))
    with tempfile.TemporaryDirectory(prefix="tuner-preview-") as tmp:
        ctx = TrialContext(trial_number=0, state_dir=Path(tmp), gpus=tuple(pool[:n]), label="baseline")
        preview = target.command_preview(params, ctx)
    if preview is None:
        return f"target kind {agent.spec.target.kind!r} runs in-process: no command to launch"
    argv, env = preview
    env = redact_mapping(env)  # secrets (HF_TOKEN=...) and URLs' passwords and tokens are shown as ***
    argv = [redact_text(a) for a in argv]
    lines = ["# environment (added to the tuner's own)"]
    lines += [f"{k}={v}" for k, v in sorted(env.items())] or ["(none)"]
    lines += ["# argv", json.dumps(argv), "# as a shell line", format_command(argv, env)]
    return "\n".join(lines)
