"""`tuner report` in headless Chromium for a study of the sim's full space (12 knobs) with two scenarios: each
trial row stays short (the knobs changed from the baseline, the rest behind a <details>), and the scenario
table shows each scenario's champion and its gains with intervals from a cross-evaluation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.integration.review.test_mlflow_surface import browser  # noqa: F401 - the module's Chromium fixture
from tests.support.agents import write_agent
from tuner.cli.main import app
from tuner.context import open_context
from tuner.loop import run_cycle
from tuner.promotion.act import check_and_act
from tuner.scenarios.matrix import cross_evaluate
from tuner.scenarios.session import plan_cycle

REPO = Path(__file__).resolve().parents[3]
MAX_ROW_PX = 100  # five lines: random proposals change 8-10 of the 12 knobs; all knobs in a narrow column made ~400 px


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("report-scenarios")
    agent = tmp / "wide.yaml"
    busy_wl = {"arrival": {"kind": "closed", "concurrency": 64}, "num_requests": 64}
    long_wl = {"arrival": {"kind": "closed", "concurrency": 1}, "output_tokens": {"dist": "fixed", "value": 256},
               "num_requests": 3}
    write_agent(agent, name="wide", search_space=str(REPO / "search_spaces" / "sim.yaml"),
                tracking={"enabled": False}, sampler={"name": "random", "seed": 4},
                promotion={"policy": "auto", "verify_runs": 2, "min_improvement": 0.0, "confidence": 0.6},
                scenarios=[{"name": "busy", "concurrency": {"min": 8}, "workload": busy_wl},
                           {"name": "long", "concurrency": {"max": 2}, "workload": long_wl}],
                at={"target.noise_cv": 0.02})
    sd = tmp / "state"
    for scn in ("busy", "long"):
        planned = plan_cycle(open_context(agent, sd), None, scn)
        run_cycle(planned.session, trials=8)
        check_and_act(planned.session)
    cross_evaluate(open_context(agent, sd), runs=2)
    out = tmp / "report.html"
    res = CliRunner().invoke(app, ["report", str(agent), "--state-dir", str(sd), "--out", str(out)])
    assert res.exit_code == 0, res.output
    return {"path": out, "tmp": tmp, "agent": agent, "sd": sd}


def test_trial_rows_are_short_and_show_the_changed_knobs(report: dict[str, Any], browser: Any,  # noqa: F811
                                                         tmp_path: Path) -> None:
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    page.goto(report["path"].resolve().as_uri())
    rows = page.locator("#trials-table tbody tr")
    heights = page.evaluate("Array.from(document.querySelectorAll('#trials-table tbody tr'))"
                            ".map(r => r.getBoundingClientRect().height)")
    assert len(heights) >= 8 and max(heights) <= MAX_ROW_PX, heights
    assert "defaults" in rows.first.inner_text()  # the baseline row
    second = rows.nth(1)
    changed = second.locator("td.params > .knob").all_inner_texts()
    rest = second.locator("td.params details .knob")
    assert changed and all("=" in k for k in changed) and 8 <= len(changed) + rest.count() <= 12  # conditional knobs
    assert rest.count() == 0 or not rest.first.is_visible()  # the rest on demand
    tall = max(heights)
    row = next(i for i in range(1, len(heights)) if page.locator("#trials-table tbody tr").nth(i)
               .locator("td.params details .knob").count() >= 2)
    rows.nth(row).locator("summary").click()
    assert rows.nth(row).locator("td.params details .knob").first.is_visible()
    assert rows.nth(row).bounding_box()["height"] > heights[row]  # opened: the rest of the knobs shown
    assert tall <= MAX_ROW_PX
    page.screenshot(path=str(tmp_path / "report-trials.png"), full_page=True)
    assert (tmp_path / "report-trials.png").stat().st_size > 20_000


def test_the_scenario_table_shows_champions_and_gains_with_intervals(report: dict[str, Any],
                                                                      browser: Any) -> None:  # noqa: F811
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    page.goto(report["path"].resolve().as_uri())
    table = page.locator("#scenarios-table")
    head = table.locator("tr").first.inner_text()
    assert "over busy's champion" in head and "over long's champion" in head
    busy = table.locator("tr", has_text="concurrency >= 8").inner_text()
    assert "busy" in busy and "[" in busy and "%" in busy  # estimate [low, high]
    md = report["path"].with_suffix(".md").read_text()
    assert "| scenario | region |" in md and "| busy" in md
    status = CliRunner().invoke(app, ["status", str(report["agent"]), "--state-dir", str(report["sd"])],
                                env={"COLUMNS": "240"})
    assert status.exit_code == 0, status.output
    assert "scenarios (gains on each scenario's own traffic" in status.output and "over long" in status.output
    assert "wide.busy" in status.output  # the study of a scenario (the agent has no study of its own)
