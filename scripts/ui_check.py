"""Look at the demo's MLflow run page as a person would: start the MLflow UI on the demo's
store, open the newest raybricks run in headless Chromium, check that the per-segment
table, the plots and the promotion decision are on the page, and save screenshots.

Usage (after ``make demo``, in the directory holding ``mlflow.db`` and ``mlruns``):
``make ui-check`` or ``.venv/bin/python scripts/ui_check.py [--experiment raybricks_demo]
[--screenshots docs/images]``.

Chromium comes from Debian's packages (``sudo apt-get install chromium``). Exit codes: 0
every check passed; 1 something a person would look for is not on the page (each is
named); 2 no store, no run, no Chromium or no UI.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

STORE = "sqlite:///mlflow.db"
BROWSERS = ("chromium", "chromium-browser", "google-chrome")


@dataclass
class Page:
    """A page of the run, what must be readable on it, and its screenshot's name."""

    name: str
    path: str  # after #/experiments/<id>/runs/<run>
    expected: list[str]
    screenshot: str


def pages(run, decision: str) -> list[Page]:
    """The run page's overview (metrics and the promotion tag), the per-segment table
    (with its first segment's key), a plot and the promotion decision."""
    import mlflow

    table = mlflow.artifacts.load_dict(f"{run.info.artifact_uri}/results/segments.json")
    first_segment = str(table["data"][0][0]) if table.get("data") else ""
    return [
        Page("overview", "", ["segments_trained", "raybricks.promotion", decision],
             "mlflow-run-overview.png"),
        Page("per-segment table", "/artifacts/results/segments.json",
             ["status", "chosen", "metric_", *([first_segment] if first_segment else [])],
             "mlflow-run-segments.png"),
        Page("plot", "/artifacts/plots/model_vs_baseline.png",
             ['alt="plots/model_vs_baseline.png"'], "mlflow-run-plot.png"),  # shown
        Page("promotion decision", "/artifacts/promotion.json",
             ["decision", decision], "mlflow-run-promotion.png"),
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return True
        except OSError:
            time.sleep(0.5)
    return False


def browse(browser: str, url: str, *extra: str) -> str:
    """What headless Chromium shows at ``url`` once its scripts ran (``--dump-dom``), or
    its screenshot (``--screenshot=...``)."""
    done = subprocess.run(
        [browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--window-size=1440,1000", "--virtual-time-budget=20000", *extra, url],
        capture_output=True, text=True, timeout=120)
    return done.stdout


def newest_run(experiment: str):
    import mlflow

    mlflow.set_tracking_uri(STORE)
    found = mlflow.get_experiment_by_name(experiment)
    if found is None:
        return None, None
    runs = mlflow.search_runs([found.experiment_id], order_by=["start_time DESC"],
                              max_results=1, output_format="list")
    return found, (runs[0] if runs else None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", default="raybricks_demo")
    parser.add_argument("--screenshots", default="docs/images")
    args = parser.parse_args(argv)
    browser = next(filter(None, map(shutil.which, BROWSERS)), None)
    if browser is None:
        print("ui-check: no Chromium: install it (sudo apt-get install chromium)")
        return 2
    if not Path("mlflow.db").exists():
        print("ui-check: no ./mlflow.db here: run `make demo` first (in this directory)")
        return 2
    experiment, run = newest_run(args.experiment)
    if run is None:
        print(f"ui-check: no run in experiment {args.experiment!r}: run `make demo` first")
        return 2
    decision = run.data.tags.get("raybricks.promotion", "")
    port = free_port()
    server = subprocess.Popen(
        [str(Path(sys.executable).with_name("mlflow")), "server", "--backend-store-uri",
         STORE, "--default-artifact-root", "./mlruns", "--host", "127.0.0.1",
         "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        if not wait_for(f"{base}/health", 90):
            print(f"ui-check: the MLflow UI did not answer on {base}")
            return 2
        shots = Path(args.screenshots)
        shots.mkdir(parents=True, exist_ok=True)
        missing = []
        run_url = f"{base}/#/experiments/{experiment.experiment_id}/runs/{run.info.run_id}"
        for page in pages(run, decision):
            dom = browse(browser, run_url + page.path, "--dump-dom")
            absent = [text for text in page.expected if text not in dom]
            browse(browser, run_url + page.path, f"--screenshot={shots / page.screenshot}")
            state = "ok" if not absent else f"MISSING {absent}"
            print(f"{page.name:20s} {state:10s} {shots / page.screenshot}")
            missing += [f"{page.name}: {text!r}" for text in absent]
        print(f"run {run.info.run_id} of {args.experiment!r}, promotion {decision!r}: "
              + ("everything a person looks for is on the page" if not missing
                 else f"not on the page: {'; '.join(missing)}"))
        return 1 if missing else 0
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
