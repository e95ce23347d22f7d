"""MLflow as the review surface, and `tuner report`: what an operator reads, checked on real stores.

The sim study (feasible, SLO-breaking and constraint-violating trials, a verified promotion) and a command-target
study whose out-of-memory trial left a server log share one state dir, built once for the module.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.support.review_state import command_state, sim_state
from tuner.cli.main import app
from tuner.tracking.tracker import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, Tracker, default_tracking_uri


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("review")
    sim_agent, sd = sim_state(tmp)
    cmd_agent = command_state(tmp, sd)
    return {"tmp": tmp, "sd": sd, "sim": sim_agent, "cmd": cmd_agent}


def _tracker(sd: Path, experiment: str) -> Tracker:
    return Tracker(default_tracking_uri(sd), experiment, artifact_dir=sd / "mlartifacts")


def _artifacts(tr: Tracker, run_id: str, path: str | None = None) -> set[str]:
    return {a.path for a in tr.client.list_artifacts(run_id, path)}


def test_experiment_is_tagged_for_model_training(state: dict[str, Path]) -> None:
    tr = _tracker(state["sd"], "review-sim")
    exp = tr.client.get_experiment(tr.experiment_id)
    assert exp.tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND


def test_trial_runs_say_what_they_are_and_failed_ones_log_no_placeholders(state: dict[str, Path]) -> None:
    tr = _tracker(state["sd"], "review-sim")
    trials = [r for r in tr.runs() if r.data.tags.get("kind") == "trial"]
    names = {r.info.run_name for r in trials}
    assert "trial-0 baseline feasible" in names or any(n.startswith("trial-0 baseline") for n in names)
    failed = [r for r in trials if r.data.tags["failure_cause"]]
    assert [r.info.run_name for r in failed] == ["trial-1 failed infeasible_config"]
    assert failed[0].data.metrics == {}  # no objective 0, no violation 1e6
    assert "max_num_batched_tokens >= max_num_seqs" in failed[0].data.tags["error"]
    breaking = [r for r in trials if " infeasible " in r.info.run_name and not r.data.tags["failure_cause"]]
    for r in breaking:
        assert r.info.run_name.endswith("ttft_ms.p99")
        assert r.data.tags["slo_broken"] == "ttft_ms.p99"
        assert r.data.metrics["violation_slo_ttft_ms_p99"] > 0
    measured = [r for r in trials if not r.data.tags["failure_cause"]]
    for r in measured:
        assert {"output_throughput", "p99_ttft_ms", "p99_itl_ms"} <= set(r.data.metrics)
        assert "plots" in _artifacts(tr, r.info.run_id)
        assert _artifacts(tr, r.info.run_id, "plots") == {"plots/latency_cdf.png"}


def _png_ok(tr: Tracker, run_id: str, path: str, tmp: Path) -> None:
    local = Path(tr.client.download_artifacts(run_id, path, str(tmp)))
    data = local.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, f"{path}: not a drawn PNG ({len(data)} bytes)"


def test_cycle_run_carries_the_study_plots(state: dict[str, Path], tmp_path: Path) -> None:
    tr = _tracker(state["sd"], "review-sim")
    cycle = next(r for r in tr.runs() if r.data.tags.get("kind") == "cycle")
    plots = _artifacts(tr, cycle.info.run_id, "plots")
    assert plots == {f"plots/{n}.png" for n in ("optimization_history", "parallel_coordinates",
                                                 "param_importances", "slo_feasibility")}
    for p in plots:
        _png_ok(tr, cycle.info.run_id, p, tmp_path)


def test_verification_run_is_nested_under_the_cycle_of_its_candidate(state: dict[str, Path]) -> None:
    tr = _tracker(state["sd"], "review-sim")
    runs = tr.runs()
    cycle = next(r for r in runs if r.data.tags.get("kind") == "cycle")
    ver = [r for r in runs if r.data.tags.get("kind") == "verification"]
    assert len(ver) == 1
    assert ver[0].data.tags["mlflow.parentRunId"] == cycle.info.run_id
    assert ver[0].info.run_name.startswith(f"verify-trial-{ver[0].data.tags['candidate_trial']} ")


def test_a_failed_trial_carries_its_server_log(state: dict[str, Path], tmp_path: Path) -> None:
    tr = _tracker(state["sd"], "review-cmd")
    trials = {r.data.tags["trial"]: r for r in tr.runs() if r.data.tags.get("kind") == "trial"}
    oom = trials["1"]
    assert oom.info.run_name == "trial-1 failed out_of_memory"
    assert oom.info.status == "FAILED" and oom.data.metrics == {}
    assert "trial-1.log" in _artifacts(tr, oom.info.run_id)
    log = Path(tr.client.download_artifacts(oom.info.run_id, "trial-1.log", str(tmp_path))).read_text()
    assert "CUDA out of memory" in log
    ok = trials["0"]
    assert {"trial-0.log", "requests.csv", "plots"} <= _artifacts(tr, ok.info.run_id)
    _png_ok(tr, ok.info.run_id, "plots/latency_cdf.png", tmp_path)


# ---------------------------------------------------------------- tuner report
@pytest.fixture(scope="module")
def report(state: dict[str, Path]) -> dict[str, Any]:
    out = state["tmp"] / "out" / "report.html"
    res = CliRunner().invoke(app, ["report", str(state["sim"]), "--state-dir", str(state["sd"]), "--out", str(out),
                                   "--json"])
    assert res.exit_code == 0, res.output
    paths = json.loads(res.output)
    return {"html": Path(paths["html"]).read_text(), "md": Path(paths["markdown"]).read_text(),
            "path": Path(paths["html"]), "state": state}


def test_report_is_self_contained(report: dict[str, Any]) -> None:
    html = report["html"]
    # nothing fetched: no external script, style, image or font; every image inlined
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert "@import" not in html and "url(http" not in html
    imgs = re.findall(r'<img[^>]*src="([^"]+)"', html)
    assert len(imgs) == 4 and all(s.startswith("data:image/png;base64,") for s in imgs)


def test_report_shows_what_the_operator_needs(report: dict[str, Any]) -> None:
    from tuner.champions.store import ChampionStore

    html, md = report["html"], report["md"]
    champ = ChampionStore(report["state"]["sd"], "review-sim").champion()
    assert champ is not None
    assert f"champion: trial {champ.trial}" in html
    assert 'id="trials-table" class="sortable"' in html
    assert "infeasible_config" in html and "max_num_batched_tokens &gt;= max_num_seqs" in html
    assert "PASS" in html and "promote" in html  # the verdict and the promotion
    assert "a100-80gb-sxm" in html and "rate_per_s: 30" in html  # hardware and workload
    assert f"| champion | {champ.trial} |" in md
    assert "Failures by cause: infeasible_config 1." in md


def test_report_of_an_agent_without_a_study_says_so(tmp_path: Path, state: dict[str, Path]) -> None:
    res = CliRunner().invoke(app, ["report", str(state["sim"]), "--state-dir", str(tmp_path / "empty"),
                                   "--out", str(tmp_path / "r.html")])
    assert res.exit_code == 1
    assert "no study of review-sim" in res.output
    assert not (tmp_path / "empty" / "optuna.db").exists()


# ---------------------------------------------------------------- in a real browser (headless Chromium)
CHROMIUM_ARGS = ["--no-sandbox", "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--no-first-run", "--disable-quic", "--disable-gpu", "--disable-dev-shm-usage"]


def _chromium() -> str:
    import os
    import shutil

    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        msg = ("NO CHROMIUM: the browser tests need Debian's chromium package (apt-get install -y chromium); "
               ".ci/run installs it")
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return path


@pytest.fixture(scope="module")
def browser() -> Any:
    playwright = pytest.importorskip("playwright.sync_api")
    path = _chromium()
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def _images(page: Any) -> list[dict[str, Any]]:
    return page.evaluate("Array.from(document.images).map(i => ({alt: i.alt, src: i.src.slice(0, 40), "
                         "w: i.naturalWidth, h: i.naturalHeight, complete: i.complete}))")


def test_report_in_chromium(report: dict[str, Any], browser: Any, tmp_path: Path) -> None:
    from tuner.champions.store import ChampionStore

    champ = ChampionStore(report["state"]["sd"], "review-sim").champion()
    assert champ is not None
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(report["path"].resolve().as_uri())
    assert page.locator("#card-champion h3").inner_text() == f"champion: trial {champ.trial}"
    imgs = _images(page)
    assert len(imgs) == 4 and all(i["complete"] and i["w"] > 200 and i["h"] > 100 for i in imgs), imgs
    assert "infeasible_config" in page.locator("#failures-table").inner_text()
    assert "PASS" in page.locator("#verifications-table").inner_text()
    # the trial table sorts: a click on the objective's header orders the rows by it
    header = page.locator("#trials-table th", has_text="output_throughput")
    header.click()
    col = page.locator("#trials-table th").all_inner_texts().index(header.inner_text())
    cells = page.locator(f"#trials-table tbody tr td:nth-child({col + 1})").all_inner_texts()
    nums = [float(c.replace(",", "")) for c in cells if c.strip()]
    assert nums == sorted(nums) and len(nums) >= 5
    assert all(u.startswith(("file:", "data:")) for u in requests), requests  # nothing from the network
    page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
    assert (tmp_path / "report.png").stat().st_size > 50_000


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_mlflow_ui_as_tuner_ui_serves_it(state: dict[str, Path], browser: Any, tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import threading
    import time

    from tuner.targets.process import free_port, group_alive

    sd = state["sd"]
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tuner.cli", "ui", "--state-dir", str(sd), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "MLflow UI on http://" in line:
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        assert ready.wait(400), "tuner ui never announced its URL:\n" + "".join(lines)
        url = re.search(r"(http://\S+)", next(x for x in lines if "MLflow UI on http://" in x)).group(1)
        import urllib.request

        with urllib.request.urlopen(url.split("#")[0] + "health", timeout=10) as resp:  # answers once announced
            assert resp.status == 200
        base = url.split("/#")[0]
        sim, cmd = _tracker(sd, "review-sim"), _tracker(sd, "review-cmd")
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        # the printed URL opens the model-training view (runs tables), not the GenAI traces page
        page.goto(url, timeout=120_000)
        page.get_by_text("review-sim").first.wait_for(timeout=120_000)
        page.goto(f"{base}/#/experiments/{sim.experiment_id}/runs?workflowType=machine_learning", timeout=120_000)
        page.get_by_text("cycle-1").first.wait_for(timeout=120_000)
        page.get_by_text("Model training").first.wait_for(timeout=10_000)
        page.screenshot(path=str(tmp_path / "mlflow-runs.png"))
        # the cycle's plots render as images in the artifact view
        cycle = next(r for r in sim.runs() if r.data.tags.get("kind") == "cycle")
        page.goto(f"{base}/#/experiments/{sim.experiment_id}/runs/{cycle.info.run_id}/artifacts/plots/"
                  "optimization_history.png?workflowType=machine_learning", timeout=120_000)
        page.wait_for_function("Array.from(document.images).some(i => i.src.startsWith('blob:') && "
                               "i.complete && i.naturalWidth > 200)", timeout=120_000)
        page.screenshot(path=str(tmp_path / "mlflow-plot.png"))
        # a failed trial: its cause on the run page, its server log among the artifacts and readable
        oom = next(r for r in cmd.runs() if r.data.tags.get("trial") == "1")
        page.goto(f"{base}/#/experiments/{cmd.experiment_id}/runs/{oom.info.run_id}?workflowType=machine_learning",
                  timeout=120_000)
        page.get_by_text("trial-1 failed out_of_memory").first.wait_for(timeout=120_000)
        assert page.get_by_text("out_of_memory").count() >= 2  # the run name and the failure_cause tag
        page.goto(f"{base}/#/experiments/{cmd.experiment_id}/runs/{oom.info.run_id}/artifacts/trial-1.log"
                  "?workflowType=machine_learning", timeout=120_000)
        page.get_by_text("trial-1.log").first.wait_for(timeout=60_000)
        page.get_by_text("CUDA out of memory").first.wait_for(timeout=60_000)
        page.screenshot(path=str(tmp_path / "mlflow-failed-trial.png"))
        # SIGTERM takes the whole MLflow server group down
        from tuner.targets.process import _registry_dir

        groups = [json.loads(p.read_text())["pgid"] for p in _registry_dir(sd).glob("*.json")]
        assert groups, "the MLflow server was not registered"
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
    assert rc == 0
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(group_alive(g) for g in groups):
        time.sleep(0.2)
    assert not any(group_alive(g) for g in groups)
    left = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmdline = (d / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"mlflow" in b" ".join(cmdline) and str(port).encode() in cmdline:
                left.append(int(d.name))
    assert left == [], f"processes of the MLflow UI left running: {left}"
    assert os.path.exists(tmp_path / "mlflow-runs.png")
