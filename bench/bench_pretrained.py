"""Pretrained forecasters on the CPU: series per second of Chronos-Bolt, Chronos-2 and
TimesFM 2.5 at their released sizes, through raybricks' own loading and batching
(``raybricks.kinds.pretrained``), beside statsforecast's AutoETS on the same series.

No model hub is reachable here, so the models are built at the released architectures'
sizes with random weights (their speed does not depend on the weights' values: the same
layers, the same multiplications), saved with the packages' own save methods and loaded
from the folder as a user's weights are. Accuracy is not measured here (random weights):
docs/forecasting.md cites the published figures.

Series: daily, ``--length`` points (a weekly pattern, trend and noise); each model
forecasts ``--horizon`` days from every series in batches of ``--batch`` on 1 and 2 torch
threads. A raybricks backtest of W windows makes W + 1 forecasts of a series (the
windows, then the stored forecast after its history): ``backtest_per_s`` divides by
that. AutoETS (season 7) fits and forecasts each series once (``forecast``) on one core,
the per-series cost of a statistical candidate: ``ratio_to_autoets`` is its seconds per
series over the model's at one thread.

Usage (in ``.venv-foundation``, ``make test-foundation`` builds it):
``python bench/bench_pretrained.py [--series 256] [--length 512] [--horizon 14]
[--windows 3] [--models bolt-small,chronos-2,timesfm-2.5]``.
Results: ``bench/results/pretrained.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

RESULTS = Path(__file__).parent / "results" / "pretrained.json"


def bolt_small(folder: Path) -> Path:
    """Chronos-Bolt small's architecture (T5, d_model 512, 6 + 6 layers: 47.7M)."""
    from chronos.chronos_bolt import ChronosBoltModelForForecasting
    from transformers import T5Config

    config = T5Config(
        d_model=512, d_ff=2048, d_kv=64, num_heads=8, num_layers=6, num_decoder_layers=6,
        feed_forward_proj="relu", dropout_rate=0.0, decoder_start_token_id=0,
        pad_token_id=0, eos_token_id=1, vocab_size=2, is_encoder_decoder=True,
        chronos_pipeline_class="ChronosBoltPipeline",
        chronos_config={"context_length": 2048, "prediction_length": 64,
                        "input_patch_size": 16, "input_patch_stride": 16,
                        "quantiles": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9],
                        "use_reg_token": True})
    ChronosBoltModelForForecasting(config).save_pretrained(folder)
    return folder


def chronos_2(folder: Path) -> Path:
    """Chronos-2's architecture (d_model 768, 12 layers: 120M)."""
    from chronos.chronos2 import Chronos2CoreConfig, Chronos2Model, Chronos2Pipeline

    from tests.pretrained_models import QUANTILES_2

    config = Chronos2CoreConfig(
        d_model=768, d_kv=64, d_ff=3072, num_layers=12, num_heads=12,
        feed_forward_proj="relu", attn_implementation="sdpa",
        chronos_pipeline_class="Chronos2Pipeline",
        chronos_config={"context_length": 8192, "input_patch_size": 16,
                        "input_patch_stride": 16, "output_patch_size": 16,
                        "max_output_patches": 64, "quantiles": QUANTILES_2,
                        "use_reg_token": True, "use_arcsinh": True,
                        "time_encoding_scale": 8192})
    Chronos2Pipeline(model=Chronos2Model(config)).save_pretrained(folder)
    return folder


def timesfm_25(folder: Path) -> Path:
    """TimesFM 2.5's released definition (231M)."""
    from timesfm.timesfm_2p5 import timesfm_2p5_torch

    model = timesfm_2p5_torch.TimesFM_2p5_200M_torch.__new__(
        timesfm_2p5_torch.TimesFM_2p5_200M_torch)
    model.model, model.torch_compile = timesfm_2p5_torch.TimesFM_2p5_200M_torch_module(), False
    folder.mkdir(parents=True, exist_ok=True)
    model._save_pretrained(folder)
    return folder


MODELS = {"bolt-small": ("chronos", bolt_small), "chronos-2": ("chronos", chronos_2),
          "timesfm-2.5": ("timesfm", timesfm_25)}


def daily(count: int, length: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    t = np.arange(length)
    return [50 + 0.02 * t * rng.uniform(-1, 1) + 8 * np.sin(2 * np.pi * t / 7 + s)
            + rng.normal(scale=3, size=length) for s in range(count)]


def autoets_seconds(series: list[np.ndarray], horizon: int) -> float:
    """AutoETS' seconds per series (fit and forecast once), one core."""
    from statsforecast.models import AutoETS

    AutoETS(season_length=7).forecast(y=series[0], h=horizon)  # compiled once
    began = time.perf_counter()
    for values in series:
        AutoETS(season_length=7).forecast(y=values, h=horizon)
    return (time.perf_counter() - began) / len(series)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--series", type=int, default=256)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--horizon", type=int, default=14)
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args()

    from raybricks.kinds import pretrained

    series = daily(args.series, args.length)
    requests = [pretrained.Request(values) for values in series]
    ets = autoets_seconds(series[:64], args.horizon)
    found = {"series": args.series, "length": args.length, "horizon": args.horizon,
             "windows": args.windows, "batch": args.batch,
             "autoets_series_per_s": round(1 / ets, 1), "models": {}}
    print(f"AutoETS: {1 / ets:.1f} series/s (one core)")
    with tempfile.TemporaryDirectory(prefix="raybricks-bench-") as root:
        for name in args.models.split(","):
            kind_name, build = MODELS[name]
            folder = build(Path(root) / name)
            kind = pretrained.ChronosKind if kind_name == "chronos" else pretrained.TimesFMKind
            began = time.perf_counter()
            pipeline = kind.pipeline(folder, "cpu", 1)
            loaded = time.perf_counter() - began
            import torch

            parameters = sum(p.numel() for p in (
                pipeline.model.parameters()))
            row = {"parameters_m": round(parameters / 1e6, 1),
                   "load_s": round(loaded, 2)}
            for threads in (1, 2):
                torch.set_num_threads(threads)
                kind.forecast_batch(pipeline, requests[:args.batch], args.horizon, args.batch)
                began = time.perf_counter()
                kind.forecast_batch(pipeline, requests, args.horizon, args.batch)
                per_s = args.series / (time.perf_counter() - began)
                row[f"series_per_s_{threads}_thread"] = round(per_s, 1)
                row[f"backtest_per_s_{threads}_thread"] = round(per_s / (args.windows + 1), 2)
            row["ratio_to_autoets"] = round(ets * row["series_per_s_1_thread"], 3)
            found["models"][name] = row
            print(name, row, flush=True)
            del pipeline
    stored = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    stored[f"{args.series}x{args.length}/h{args.horizon}"] = found
    RESULTS.write_text(json.dumps(stored, indent=2) + "\n")


if __name__ == "__main__":
    main()
