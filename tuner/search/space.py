"""Search spaces: typed parameters with defaults, conditions (`when:`) and constraints.

File format (search_spaces/<target>.yaml):

    target: sim                      # optional: the target kind this space is for
    params:
      max_num_seqs: {type: int, low: 8, high: 1024, log: true, default: 256}
      gpu_memory_utilization: {type: float, low: 0.7, high: 0.95, default: 0.92}
      cudagraph_mode: {type: categorical, choices: [NONE, FULL_AND_PIECEWISE], default: FULL_AND_PIECEWISE}
      enforce_eager: {type: bool, default: false}
      max_cudagraph_capture_size: {type: int, low: 8, high: 512, default: 512, when: "not enforce_eager"}
    constraints:
      - "max_num_batched_tokens >= max_num_seqs"
    fixed: {dtype: bfloat16}        # optional: passed to every trial, never tuned
    facts: {device: cpu}             # optional: facts about the host, readable in conditions and
                                     # constraints, never passed to the target; the target supplies
                                     # the real values (Target.facts()), these are defaults

A parameter whose `when` is false is not sampled and not passed to the target (its own default
applies). A sample that violates a constraint is never deployed: the study records it infeasible.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tuner.base.expr import Expr, ExprError
from tuner.base.yamlio import Loc, line_of, load_yaml, pydantic_to_config_error
from tuner.errors import ConfigError

if TYPE_CHECKING:
    import optuna


class ParamSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    type: Literal["int", "float", "categorical", "bool"]
    default: Any
    low: float | None = None
    high: float | None = None
    step: float | None = Field(default=None, gt=0)
    log: bool = False
    choices: list[Any] | None = None
    when: str | None = None
    description: str = ""

    @model_validator(mode="after")
    def _check(self) -> ParamSpec:
        t = self.type
        if t in ("int", "float"):
            if self.low is None or self.high is None:
                raise ValueError(f"type {t} needs low and high")
            if self.low > self.high:
                raise ValueError(f"low ({self.low}) must be <= high ({self.high})")
            if self.log and self.low <= 0:
                raise ValueError(f"log scale needs low > 0 (got {self.low})")
            if self.log and self.step is not None and not (t == "int" and self.step == 1):
                raise ValueError("log scale cannot take a step")
            if self.choices is not None:
                raise ValueError(f"type {t} takes low/high, not choices")
            if t == "int":
                for name in ("low", "high", "step"):
                    v = getattr(self, name)
                    if v is not None and float(v) != int(v):
                        raise ValueError(f"type int needs an integer {name} (got {v})")
                if self.default is not None and (isinstance(self.default, bool) or
                                                 not isinstance(self.default, int)):
                    raise ValueError(f"default must be an integer (got {self.default!r})")
            elif self.default is not None and (isinstance(self.default, bool) or
                                               not isinstance(self.default, int | float)):
                raise ValueError(f"default must be a number (got {self.default!r})")
            if self.default is not None and not (self.low <= self.default <= self.high):
                raise ValueError(f"default {self.default!r} is outside [{self.low}, {self.high}]")
        elif t == "categorical":
            if not self.choices:
                raise ValueError("type categorical needs a non-empty choices list")
            if len(set(map(repr, self.choices))) != len(self.choices):
                raise ValueError("choices must be unique")
            if self.default not in self.choices:
                raise ValueError(f"default {self.default!r} is not one of the choices {self.choices}")
        elif t == "bool":
            if not isinstance(self.default, bool):
                raise ValueError(f"default must be true or false (got {self.default!r})")
            if self.low is not None or self.high is not None or self.choices is not None:
                raise ValueError("type bool takes only default")
        return self


class _SpaceFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    target: str | None = None
    description: str = ""
    params: dict[str, ParamSpec] = Field(min_length=1)
    constraints: list[str] = []
    fixed: dict[str, Any] = {}
    facts: dict[str, Any] = {}


class Param:
    """One parameter with its compiled condition."""

    def __init__(self, name: str, spec: ParamSpec, when: Expr | None) -> None:
        self.name = name
        self.spec = spec
        self.when = when

    @property
    def default(self) -> Any:
        return self.spec.default

    def distribution(self) -> optuna.distributions.BaseDistribution:
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        s = self.spec
        if s.type == "int":
            assert s.low is not None and s.high is not None
            return IntDistribution(int(s.low), int(s.high), log=s.log, step=int(s.step or 1))
        if s.type == "float":
            assert s.low is not None and s.high is not None
            return FloatDistribution(float(s.low), float(s.high), log=s.log, step=s.step)
        if s.type == "bool":
            return CategoricalDistribution([False, True])
        assert s.choices is not None
        return CategoricalDistribution(list(s.choices))

    def grid(self, points: int = 5) -> list[Any]:
        """Values for a grid sampler: all choices, or `points` spread over a numeric range."""
        import numpy as np

        s = self.spec
        if s.type == "bool":
            return [False, True]
        if s.type == "categorical":
            assert s.choices is not None
            return list(s.choices)
        assert s.low is not None and s.high is not None
        if s.log:
            vals = np.geomspace(s.low, s.high, points)
        else:
            vals = np.linspace(s.low, s.high, points)
        if s.type == "int":
            return sorted({int(round(v)) for v in vals})
        return [float(v) for v in vals]


# a resource check: the full configuration -> what it needs beyond the target (e.g. "needs 16 GPUs, has 8")
ResourceCheck = Callable[[Mapping[str, Any]], list[str]]
RESOURCES_PREFIX = "target resources: "


class SearchSpace:
    """Ordered parameters, constraints and fixed values. Conditions may only read earlier params."""

    def __init__(self, params: list[Param], constraints: list[Expr], fixed: Mapping[str, Any],
                 target: str | None = None, source: str = "<inline>",
                 facts: Mapping[str, Any] | None = None, resources: ResourceCheck | None = None) -> None:
        self.params = params
        self.facts = dict(facts or {})
        self.by_name = {p.name: p for p in params}
        self.constraints = constraints
        self.fixed = dict(fixed)
        self.target = target
        self.source = source
        # the target's real resources (Target.resource_violations): what a configuration needs beyond what the
        # target has (GPUs, memory), checked with the declared constraints wherever a configuration is judged
        self.resources = resources

    def bind_facts(self, facts: Mapping[str, Any]) -> SearchSpace:
        """A copy whose facts take the target's real values (only declared facts are taken)."""
        merged = {**self.facts, **{k: v for k, v in facts.items() if k in self.facts}}
        return SearchSpace(self.params, self.constraints, self.fixed, self.target, self.source, merged,
                           self.resources)

    def bind_resources(self, check: ResourceCheck | None) -> SearchSpace:
        """A copy whose `violations` also lists what `check(full config)` says exceeds the target's resources."""
        return SearchSpace(self.params, self.constraints, self.fixed, self.target, self.source, self.facts, check)

    def _env(self, chosen: Mapping[str, Any]) -> dict[str, Any]:
        return {**self.facts, **self.fixed, **_missing(self, chosen), **chosen}

    def defaults(self) -> dict[str, Any]:
        """The baseline: every active parameter at its default (conditions applied). An ExprError if a
        condition cannot be evaluated on it."""
        out: dict[str, Any] = {}
        for p in self.params:
            if p.when is None or p.when(self._env(out)):
                out[p.name] = p.default
        return out

    def point(self, given: Mapping[str, Any]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        """A configuration from some knobs' values (the rest at their defaults, conditions applied) and what is
        wrong with it, as (knob, rule) pairs: a knob the space does not have, one whose condition is off, a
        value outside its range or choices, a constraint it violates (knob "")."""
        problems = [(k, f"not a knob of the search space (knobs: {', '.join(self.by_name)})")
                    for k in given if k not in self.by_name]
        out: dict[str, Any] = {}
        for p in self.params:
            if not self.active(p, out):
                if p.name in given:
                    problems.append((p.name, f"inactive here: its condition {p.spec.when!r} is false"))
                continue
            v = given.get(p.name, p.default)
            if not _holds(p.spec, v):
                problems.append((p.name, f"{v!r} is not a value of this knob ({_describe(p.spec)})"))
            out[p.name] = v
        if not problems:
            problems += [("", f"violates the constraint {c}") for c in self.violations(out, resources=False)]
        return out, problems

    def check_expressions(self, params: Mapping[str, Any]) -> None:
        """Evaluate every condition and constraint on `params`: an ExprError for the first that cannot be
        evaluated (a division by zero, a comparison of a number with a string)."""
        env = self._env(params)
        for p in self.params:
            if p.when is not None:
                p.when(env)
        for c in self.constraints:
            c(env)

    def active(self, param: Param, chosen: Mapping[str, Any]) -> bool:
        """Whether the parameter's condition holds; a condition that cannot be evaluated for these values
        (a division by zero, values of the wrong kind) leaves the parameter inactive. `validate` has
        already evaluated every condition on the defaults."""
        if param.when is None:
            return True
        try:
            return bool(param.when(self._env(chosen)))
        except ExprError:
            return False

    def violations(self, params: Mapping[str, Any], *, resources: bool = True) -> list[str]:
        """Constraints that `params` violate (by source text), then (with `resources`) what they need beyond the
        target's resources (each prefixed RESOURCES_PREFIX)."""
        env = self._env(params)
        bad = []
        for c in self.constraints:
            try:
                ok = bool(c(env))
            except (TypeError, ExprError):
                ok = False
            if not ok:
                bad.append(c.source)
        if resources and self.resources is not None:
            bad += [RESOURCES_PREFIX + r for r in self.resources(self.full_config(params))]
        return bad

    def full_config(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """What the target receives: fixed values plus the active sampled params."""
        return {**self.fixed, **params}

    def offered_values(self, *, every_int: Collection[str] = (), limit: int = 64) -> Iterator[tuple[str, str, Any]]:
        """(knob, field, value) for the values this space can hand a target that a target checks one by one:
        every choice (and both booleans), a range's low, high and default, every fixed value; for the int
        ranges of the knobs in `every_int` (a knob whose rule is a set, not an interval) also each value of
        the range, the first `limit`. `field` is where the value is written (`params.X.choices`, `params.X.low`,
        `fixed.X`)."""
        for p in self.params:
            s = p.spec
            if s.type in ("categorical", "bool"):
                field = f"params.{p.name}.choices" if s.type == "categorical" else f"params.{p.name}"
                for v in p.grid():
                    yield p.name, field, v
                continue
            for key in ("low", "high", "default"):
                v = getattr(s, key)
                if v is not None:
                    yield p.name, f"params.{p.name}.{key}", int(v) if s.type == "int" else v
            if p.name in every_int and s.type == "int" and s.low is not None and s.high is not None:
                for v in range(int(s.low), min(int(s.high), int(s.low) + limit) + 1, int(s.step or 1)):
                    yield p.name, f"params.{p.name}", v
        for name, v in self.fixed.items():
            yield name, f"fixed.{name}", v


def _missing(space: SearchSpace, chosen: Mapping[str, Any]) -> dict[str, Any]:
    """Inactive parameters read as None in conditions and constraints."""
    return {p.name: None for p in space.params if p.name not in chosen}


def parse_space(data: Any, *, file: str, lines: dict[Loc, int] | None = None, prefix: Loc = ()) -> SearchSpace:
    lines = lines or {}
    if not isinstance(data, dict):
        raise ConfigError("a search space must be a mapping with params", file=file,
                          line=line_of(lines, prefix), field=".".join(map(str, prefix)) or None)
    try:
        sf = _SpaceFile.model_validate(data)
    except ValidationError as exc:
        raise pydantic_to_config_error(exc, file, lines, prefix=prefix) from None
    params: list[Param] = []
    seen: set[str] = set()
    names = set(sf.params) | set(sf.fixed) | set(sf.facts)

    def compiled(src: str, loc: tuple[Any, ...], what: str) -> Expr:
        """`src` compiled, naming only declared parameters; else a ConfigError located at `loc`."""
        try:
            expr = Expr(src)
        except ExprError as exc:
            raise ConfigError(str(exc), file=file, line=line_of(lines, loc),
                              field=".".join(map(str, loc))) from None
        unknown = expr.names - names
        if unknown:
            raise ConfigError(f"{what} names unknown parameter(s) {sorted(unknown)}", file=file,
                              line=line_of(lines, loc), field=".".join(map(str, loc)))
        return expr

    for name, ps in sf.params.items():
        loc = (*prefix, "params", name, "when")
        when = None
        if ps.when:
            when = compiled(ps.when, loc, "condition")
            later = when.names - seen - set(sf.fixed) - set(sf.facts)
            if later:
                raise ConfigError(f"condition reads {sorted(later)}, which must be declared before {name!r}",
                                  file=file, line=line_of(lines, loc), field=".".join(map(str, loc)))
        params.append(Param(name, ps, when))
        seen.add(name)
    constraints = []
    for i, src in enumerate(sf.constraints):
        constraints.append(compiled(src, (*prefix, "constraints", i), "constraint"))
    space = SearchSpace(params, constraints, sf.fixed, target=sf.target, source=file, facts=sf.facts)
    try:
        space.check_expressions(space.defaults())
    except ExprError as exc:
        loc = _expr_loc(exc, params, constraints, prefix)
        raise ConfigError(str(exc), file=file, line=line_of(lines, loc), field=".".join(map(str, loc))) from None
    bad = space.violations(space.defaults())
    if bad:
        raise ConfigError(f"the defaults (baseline) violate constraint(s) {bad}", file=file,
                          line=line_of(lines, (*prefix, "constraints")), field="constraints")
    return space


def _expr_loc(exc: ExprError, params: list[Param], constraints: list[Expr], prefix: Loc) -> Loc:
    """Where the expression an ExprError names sits in the file."""
    for p in params:
        if p.when is not None and p.when is exc.expr:
            return (*prefix, "params", p.name, "when")
    for i, c in enumerate(constraints):
        if c is exc.expr:
            return (*prefix, "constraints", i)
    return (*prefix, "constraints")


def load_space(path: str | Path) -> SearchSpace:
    data, lines = load_yaml(path)
    return parse_space(data, file=str(path), lines=lines)


def _holds(spec: ParamSpec, v: Any) -> bool:
    """Whether `v` is a value the parameter can take (its type, range and step, or its choices)."""
    if spec.type == "bool":
        return isinstance(v, bool)
    if spec.type == "categorical":
        return any(v == c and isinstance(v, bool) == isinstance(c, bool) for c in spec.choices or [])
    if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
        return False
    assert spec.low is not None and spec.high is not None
    if spec.type == "int" and not float(v).is_integer():
        return False
    if not spec.low <= v <= spec.high:
        return False
    return spec.step is None or abs((v - spec.low) / spec.step - round((v - spec.low) / spec.step)) < 1e-9


def _describe(spec: ParamSpec) -> str:
    if spec.type in ("int", "float"):
        return f"{spec.type} in [{spec.low:g}, {spec.high:g}]" + (f", step {spec.step:g}" if spec.step else "")
    if spec.type == "bool":
        return "true or false"
    return "one of " + ", ".join(repr(c) for c in spec.choices or [])
