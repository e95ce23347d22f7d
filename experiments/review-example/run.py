"""The example review surface in docs/: a simulated study tuned, verified and promoted through the CLI, its report,
and screenshots of the report and of the MLflow UI (as `tuner ui` serves it) taken in headless Chromium.

    .venv/bin/python experiments/review-example/run.py [--trials 16] [--out docs]

Writes docs/example-report.html, docs/example-report.md, docs/report.png and docs/mlflow-runs.png.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
AGENT = ROOT / "agents" / "sim-8xa100.yaml"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--no-first-run", "--disable-quic", "--disable-gpu", "--disable-dev-shm-usage"]


def tuner(*args: str) -> None:
    print("$ tuner", " ".join(args), flush=True)
    subprocess.run([sys.executable, "-m", "tuner.cli", *args], check=True, cwd=ROOT)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=16)
    ap.add_argument("--out", type=Path, default=ROOT / "docs")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    from tuner.targets.process import free_port

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        sd = Path(tmp) / "state"
        tuner("run", str(AGENT), "--trials", str(args.trials), "--state-dir", str(sd))
        tuner("promote", str(AGENT), "--yes", "--reason", "example", "--state-dir", str(sd))
        html = args.out / "example-report.html"
        tuner("report", str(AGENT), "--state-dir", str(sd), "--out", str(html), "--markdown",
              str(args.out / "example-report.md"))
        port = free_port()
        ui = subprocess.Popen([sys.executable, "-m", "tuner.cli", "ui", "--state-dir", str(sd), "--port", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
        url: list[str] = []
        ready = threading.Event()

        def read() -> None:
            assert ui.stdout is not None
            for line in ui.stdout:
                m = re.search(r"MLflow UI on (http://\S+)", line)
                if m:
                    url.append(m.group(1))
                    ready.set()

        threading.Thread(target=read, daemon=True).start()
        try:
            if not ready.wait(600):
                raise SystemExit("tuner ui did not start")
            chromium = shutil.which("chromium")
            with sync_playwright() as p:
                b = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
                page = b.new_page(viewport={"width": 1280, "height": 1000})
                page.goto(html.resolve().as_uri())
                page.screenshot(path=str(args.out / "report.png"), full_page=True)
                from tuner.tracking.tracker import Tracker, default_tracking_uri

                tr = Tracker(default_tracking_uri(sd), "sim-8xa100")
                cycle = next(r for r in tr.runs() if r.data.tags.get("kind") == "cycle")
                base = url[0].split("/#")[0]
                page = b.new_page(viewport={"width": 1600, "height": 900})
                # the cycle run's artifacts: the study's plots as the operator opens them
                page.goto(f"{base}/#/experiments/{tr.experiment_id}/runs/{cycle.info.run_id}/artifacts/plots/"
                          "slo_feasibility.png?workflowType=machine_learning", timeout=120_000)
                page.wait_for_function("Array.from(document.images).some(i => i.src.startsWith('blob:') && "
                                       "i.complete && i.naturalWidth > 200)", timeout=120_000)
                page.wait_for_timeout(2000)
                page.screenshot(path=str(args.out / "mlflow-runs.png"))
                b.close()
        finally:
            ui.terminate()
            ui.wait(timeout=60)
    print("wrote", *(str(args.out / n) for n in ("example-report.html", "example-report.md", "report.png",
                                                 "mlflow-runs.png")), time.strftime("%Y-%m-%d %H:%M"))


if __name__ == "__main__":
    main()
