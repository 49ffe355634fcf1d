"""Speed of two versions of raybricks in one run: the training benchmark's ratio to the
one-core loop and the forecasting benchmark's series per second against statsforecast,
for the code at REV (a worktree made for the run) and the code of this checkout.

Each version runs in its own processes (PYTHONPATH at its ``src``) with this checkout's
benchmark scripts, one after the other, alternating; ratios to the peer measured in the
same process are what compare, as machine noise moves both.

    python bench/before_after.py --before 7a7a7f4 --name issue-34
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
REPO = HERE.parent
WARM = "raybricks, statistical candidates, Ray already up"
PEERS = ["statsforecast on Spark, same models", "statsforecast in-process, same models"]


def run(script: str, args: list[str], src: Path, results: Path, env: dict | None = None
        ) -> dict:
    """One benchmark script on the code at ``src``; its saved results."""
    results.mkdir(parents=True, exist_ok=True)
    environment = os.environ | {"PYTHONPATH": str(src), "BENCH_RESULTS": str(results),
                                "RAY_AUTH_MODE": "disabled"} | (env or {})
    subprocess.run([sys.executable, str(HERE / script), *args], env=environment, check=True,
                   cwd=REPO)
    name = "training" if script == "bench_training.py" else "forecast"
    return json.loads((results / f"{name}.json").read_text())


def training_ratios(found: dict) -> dict[str, float]:
    """raybricks' segments per second over the one-core loop's, per size."""
    rates: dict[str, dict[str, float]] = {}
    for row in found["results"]:
        rates.setdefault(row["extra"]["size"], {})[row["name"]] = row["rate"]
    return {size: by["raybricks"] / by["sequential"] for size, by in rates.items()}


def forecast_rates(found: dict) -> dict[str, float]:
    """Series per second of the warm raybricks run and of the peers, per dataset."""
    out = {}
    for dataset, meta in found["meta"]["datasets"].items():
        for row in meta["measurements"]:
            out[f"{dataset}: {row['name']}"] = row["rate"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the git revision to compare with")
    parser.add_argument("--name", required=True, help="saved as results/before_after-NAME")
    parser.add_argument("--sizes", default="2000x200,20000x50")
    parser.add_argument("--dataset", default="routes")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rb-before-after-"))
    before = work / "before"
    subprocess.run(["git", "worktree", "add", "--detach", str(before), args.before],
                   cwd=REPO, check=True)
    trees = {"before": before / "src", "after": REPO / "src"}
    found: dict[str, dict] = {}
    try:
        for label, src in trees.items():
            training = run("bench_training.py", ["--only", "raybricks", "--sizes", args.sizes],
                           src, work / label)
            forecast = run("bench_forecast.py", [args.dataset], src, work / label,
                           {"BENCH_FORECAST_ONLY": "|".join([WARM, *PEERS])})
            found[label] = {"training_vs_loop": training_ratios(training),
                            "forecast_series_per_s": forecast_rates(forecast)}
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=REPO)
    rates = {label: f["forecast_series_per_s"] for label, f in found.items()}
    for label, by in rates.items():
        warm = by[f"{args.dataset}: {WARM}"]
        spark_peer = next(v for k, v in by.items() if PEERS[0] in k)
        found[label]["forecast_vs_statsforecast_on_spark"] = warm / spark_peer
    print("| | " + " | ".join(trees) + " |\n|---|---:|---:|")
    for size in found["before"]["training_vs_loop"]:
        print(f"| training {size}, x the one-core loop | "
              + " | ".join(f"{found[t]['training_vs_loop'][size]:.2f}" for t in trees) + " |")
    print(f"| forecasting {args.dataset}, warm, x statsforecast on Spark | "
          + " | ".join(f"{found[t]['forecast_vs_statsforecast_on_spark']:.2f}" for t in trees)
          + " |")
    out = HERE / "results" / f"before_after-{args.name}.json"
    out.write_text(json.dumps({"before": args.before, "found": found}, indent=2))
    print(f"saved {out}")


if __name__ == "__main__":
    main()
