"""The switching state machine (pure: fed with observed points and their times, no clock of its own).

Hysteresis in three parts, so that traffic at a boundary does not flap:
- the scenario in service is kept while the traffic stays inside its bounds widened by `exit_margin`;
- traffic enters another scenario only inside its bounds narrowed by `enter_margin` (between the two it is
  evidence for nothing: the pending candidate is dropped);
- the traffic must stay in that scenario for `dwell_s` without a break, and no switch follows another within
  `min_hold_s`.
Then the switcher says `switch` when the scenario has a champion, else `tune` (once: the daemon runs a cycle for
it, and the switch follows on the first observation after its champion exists). Traffic outside every scenario
for `dwell_s` gives `propose` (when proposing is on) with the observed point, else `outside`, once per stay.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from tuner.scenarios.regions import classify, contains
from tuner.spec import ScenarioSpec, SwitchingSpec

OUTSIDE = ""  # the candidate "outside every scenario"


@dataclass(frozen=True)
class Decision:
    kind: str  # switch | tune | propose | outside
    scenario: str | None  # the scenario to switch to or tune (None for propose and outside)
    previous: str | None  # the scenario in service before
    at_s: float  # the observation's time
    since_s: float  # when the traffic entered (the dwell began)
    point: dict[str, float] = field(default_factory=dict)

    @property
    def reason(self) -> str:
        stats = ", ".join(f"{k} {v:.3g}" for k, v in sorted(self.point.items()))
        where = f"scenario {self.scenario}" if self.scenario else "no scenario"
        return (f"traffic in {where} for {self.at_s - self.since_s:.0f}s ({stats}); "
                f"in service before: {self.previous or 'none'}")


class Switcher:
    """Feed it with `observe(time_s, point, has_champion)`; it returns the decisions of that observation."""

    def __init__(self, scenarios: Sequence[ScenarioSpec], policy: SwitchingSpec, *, active: str | None = None,
                 last_switch_s: float | None = None) -> None:
        self.scenarios = list(scenarios)
        self.policy = policy
        self.active = active  # the scenario whose champion is in service
        self.last_switch_s = last_switch_s
        self.candidate: str | None = None  # None: no candidate; OUTSIDE: outside every scenario
        self.since_s = 0.0
        self._asked: set[str] = set()  # scenarios a tune was asked for in this stay
        self._told_outside = False

    def add(self, scn: ScenarioSpec) -> None:
        """A proposed scenario joins; traffic waiting outside every scenario counts as in it since it came."""
        if all(s.name != scn.name for s in self.scenarios):
            self.scenarios.append(scn)
        if self.candidate == OUTSIDE:
            self.candidate = scn.name
            self._told_outside = False

    def spec(self, name: str) -> ScenarioSpec | None:
        return next((s for s in self.scenarios if s.name == name), None)

    def where(self, point: Mapping[str, float]) -> str | None:
        """The scenario this point is evidence for: the one in service (inside its exit region), another
        (inside its enter region), OUTSIDE (outside every exit region), or None (a boundary zone)."""
        p = self.policy
        act = self.spec(self.active) if self.active else None
        if act is not None and contains(act, point, -p.exit_margin):
            return act.name
        inner = classify(self.scenarios, point, p.enter_margin)
        if inner is not None:
            return inner
        if not any(contains(s, point, -p.exit_margin) for s in self.scenarios):
            return OUTSIDE
        return None

    def observe(self, time_s: float, point: Mapping[str, float],
                has_champion: Callable[[str], bool]) -> list[Decision]:
        if not point:
            return []
        here = self.where(point)
        if here is None or here == self.active:
            self._reset()
            return []
        if here != self.candidate:
            self._reset()
            self.candidate, self.since_s = here, time_s
        p = self.policy
        if time_s - self.since_s < p.dwell_s:
            return []
        if self.last_switch_s is not None and time_s - self.last_switch_s < p.hold_s:
            return []
        pt = dict(point)
        if here == OUTSIDE:
            if self._told_outside:
                return []
            self._told_outside = True
            return [Decision("propose" if p.propose else "outside", None, self.active, time_s, self.since_s, pt)]
        if has_champion(here):
            d = Decision("switch", here, self.active, time_s, self.since_s, pt)
            self.active, self.last_switch_s = here, time_s
            self._reset()
            return [d]
        if here in self._asked:
            return []
        self._asked.add(here)
        return [Decision("tune", here, self.active, time_s, self.since_s, pt)]

    def _reset(self) -> None:
        self.candidate = None
        self._asked.clear()
        self._told_outside = False
