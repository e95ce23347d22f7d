"""The Optuna study and what decides over it: objective values and SLO verdicts (objectives), the study
itself (sampler, storage, constraints, baseline, ask/tell: study), the run summary (summary), screening
proposals with the calibrated simulator (screen), sizing an `auto` request rate (sizing) and which study an
agent continues (lineage).

May import: tuner.agent, tuner.placement, tuner.targets, tuner.sim, tuner.measure, tuner.search,
tuner.coord and below; never the loop, tracking, champions or anything above them.
"""
