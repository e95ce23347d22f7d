"""Scenarios: named regions of workload space, each with its own study and champion, and switching between them.

`regions` (pure: where an observed workload falls, margins, the nearest scenario, proposing one around traffic
outside every scenario), `switcher` (pure: the hysteresis state machine fed with observed windows, which says
when to tune a scenario and when to put its champion in service), `store` (the scenario registry of an agent:
declared and proposed scenarios, the workload each scenario's study tunes on, which scenario is in service, the
switch journal), `session` (opening a scenario's study: its lineage, the fitted workload, a warm start from the
nearest scenario), `act` (a switch through the Act path: tuner.promotion.act), `matrix` (the cross-evaluation of
every champion on every scenario's workload) and `table` (the scenario table `tuner status` and `tuner report`
show).

Layer: above tuner.context, tuner.promotion and tuner.loop (it opens sessions, verifies and promotes); below
tuner.daemon and tuner.report, which use it. `regions` and `switcher` import only tuner.spec.
"""
