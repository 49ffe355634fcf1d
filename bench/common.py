"""Shared pieces of the benchmarks: peak-memory sampling, timing, result tables."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

#: Where results are saved (BENCH_RESULTS: elsewhere, as bench/before_after.py does).
RESULTS = Path(os.environ.get("BENCH_RESULTS") or Path(__file__).parent / "results")


class PeakRSS:
    """Samples this process's resident memory in a thread; ``peak`` is the maximum seen."""

    def __init__(self, interval: float = 0.02) -> None:
        self.process = psutil.Process()
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(self.interval)

    def __enter__(self) -> PeakRSS:
        self.baseline = self.process.memory_info().rss
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)

    @property
    def growth_mb(self) -> float:
        return max(self.peak - self.baseline, 0) / 2**20


@dataclass
class Measurement:
    name: str
    seconds: float
    units: int
    driver_peak_growth_mb: float
    extra: dict[str, Any]

    @property
    def rate(self) -> float:
        return self.units / self.seconds if self.seconds else float("nan")


@contextmanager
def measured(name: str, units: int, out: list[Measurement], **extra: Any):
    """Time the block and sample the driver's memory while it runs."""
    with PeakRSS() as rss:
        start = time.perf_counter()
        yield
        seconds = time.perf_counter() - start
    out.append(Measurement(name, seconds, units, rss.growth_mb, extra))
    print(f"{name:45s} {seconds:8.2f} s  {units / seconds:12,.0f}/s  +{rss.growth_mb:7.0f} MB")


def best_of(repeats: int, run: Callable[[list[Measurement]], None]) -> list[Measurement]:
    """Run ``run`` ``repeats`` times and keep the fastest measurement of each name."""
    best: dict[str, Measurement] = {}
    for _ in range(repeats):
        current: list[Measurement] = []
        run(current)
        for m in current:
            if m.name not in best or m.seconds < best[m.name].seconds:
                best[m.name] = m
    return list(best.values())


def save(name: str, measurements: list[Measurement], meta: dict[str, Any]) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    rows = [asdict(m) | {"rate": m.rate} for m in measurements]
    path.write_text(json.dumps({"meta": meta, "results": rows}, indent=2, default=str))
    return path


def markdown_table(measurements: list[Measurement], baseline: str, unit: str) -> str:
    """A table with rate and the ratio to ``baseline`` for every measurement."""
    base = next(m for m in measurements if m.name == baseline).rate
    lines = [
        f"| method | seconds | {unit}/s | vs {baseline} | driver peak growth (MB) |",
        "|---|---:|---:|---:|---:|",
    ]
    for m in measurements:
        lines.append(
            f"| {m.name} | {m.seconds:.2f} | {m.rate:,.0f} | {m.rate / base:.2f}x | "
            f"{m.driver_peak_growth_mb:,.0f} |"
        )
    return "\n".join(lines)
