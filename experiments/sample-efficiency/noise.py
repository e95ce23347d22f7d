"""Noise in the loop: with the agent's own noise (CV 2%), how good is the configuration the run reports as best?

    .venv/bin/python experiments/sample-efficiency/noise.py [--seeds 10] [--trials 30] [--repeats 0,2]

For each seed and each `noise.repeats` setting: one run of the agent as shipped (its sampler, its noise)
through the tuner's loop; then the reported best (TunerStudy.best(): by value, or by the lower confidence
bound when repeats are on) is measured noise-free. Printed: the median and worst noise-free best / optimum,
the median reported best (its mean over its runs when repeated) / its noise-free value (how much the run
overstates its best), the extra
measurements the repeats cost, and how often the summary says the gain is within the noise.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from compare import HERE, best_known  # noqa: E402
from harness import Evaluator, load  # noqa: E402

from tuner.loop import open_session, run_cycle  # noqa: E402
from tuner.placement.gpupool import GpuPool  # noqa: E402
from tuner.tracking.tracker import Tracker  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--agent", default="agents/sim-8xa100.yaml")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--repeats", default="0,2")
    a = ap.parse_args()
    stem = Path(a.agent).stem
    optimum, source = best_known(HERE / f"truth-{stem}.json", stem)
    clean = Evaluator.of(load(a.agent, noise_cv=0.0), Path(tempfile.mkdtemp()))
    rows = []
    for repeats in (int(x) for x in a.repeats.split(",")):
        true_ratio, overstated, extra, within = [], [], [], 0
        for seed in range(a.seeds):
            agent = load(a.agent, noise_cv=None)  # the agent's own noise
            sampler = agent.spec.sampler.model_copy(update={"seed": seed})
            spec = agent.spec.model_copy(update={
                "sampler": sampler, "storage": "memory:",
                "noise": agent.spec.noise.model_copy(update={"repeats": repeats})})
            agent = agent.model_copy(update={"spec": spec})
            with tempfile.TemporaryDirectory() as tmp:
                session = open_session(agent, Path(tmp), tracker=Tracker("file:" + tmp, spec.name, enabled=False))
                run_cycle(session, trials=a.trials, gpu_pool=GpuPool([]))
                best = session.study.best()
                report = session.study.noise_report() or {}
                extra.append(sum(len(t.user_attrs.get("repeats") or []) for t in session.study.trials()))
            if not best:
                true_ratio.append(0.0)
                continue
            v, feasible, _ = clean.value(dict(best[0].params))
            true_ratio.append((v if feasible else 0.0) / optimum)
            reported = report["best"]["mean"] if "best" in report else best[0].values[0]
            overstated.append(reported / v if v else float("inf"))
            within += bool(report.get("within_noise"))
            print(f"repeats {repeats} seed {seed}: reported {reported:.0f}, noise-free {v:.0f}",
                  file=sys.stderr, flush=True)
        rows.append({"repeats": repeats, "median_true": statistics.median(true_ratio), "worst_true": min(true_ratio),
                     "median_overstated": statistics.median(overstated), "extra_measurements":
                     statistics.mean(extra), "within_noise": within, "seeds": a.seeds})
    lines = [f"{a.agent} with its noise (noise_cv {load(a.agent, noise_cv=None).target_options.noise_cv}); "
             f"sampler as shipped; {a.seeds} seeds x {a.trials} trials; optimum {optimum:.1f} (from {source})", "",
             "| noise.repeats | reported best, noise-free / optimum: median / worst | reported / noise-free "
             "(median) | extra measurements per run (mean) | runs whose summary says 'within the noise' |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['repeats']} | {r['median_true']:.3f} / {r['worst_true']:.3f} | "
                     f"{r['median_overstated']:.3f} | {r['extra_measurements']:.1f} | "
                     f"{r['within_noise']}/{r['seeds']} |")
    text = "\n".join(lines)
    print(text)
    (HERE / f"noise-{stem}.md").write_text(text + "\n")
    (HERE / f"noise-{stem}.json").write_text(json.dumps(rows) + "\n")


if __name__ == "__main__":
    main()
