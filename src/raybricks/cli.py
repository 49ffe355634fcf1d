"""The ``raybricks`` command: ``train | validate | score | forecast | demo | submit``.

Each verb is a pair: a function that adds its arguments and one that runs it; errors
that are the user's to fix (RaybricksError) print one message and exit 2.
"""

from __future__ import annotations

import argparse
import sys


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="job config YAML")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, e.g. --set training.resume=true")


def run_train(args: argparse.Namespace) -> int:
    from raybricks.config import JobConfig
    from raybricks.pipeline import train

    config = JobConfig.load(args.config, args.set)
    report = train(config)
    print(report.summary())
    print(f"results and models: {report.result.run_dir}")
    if report.publication is not None:
        print(report.publication.describe())
    return 1 if report.result.counts()["trained"] == 0 else 0


def add_validate_arguments(parser: argparse.ArgumentParser) -> None:
    add_train_arguments(parser)
    parser.add_argument("--no-source", action="store_true",
                        help="check the config only (no Spark, no source)")
    parser.add_argument("--require-source", action="store_true",
                        help="exit 3 when the source cannot be read from here")


#: ``raybricks validate``'s exit code when the source cannot be read and
#: ``--require-source`` asks for it (0: valid; 2: invalid, as every verb's user errors).
SOURCE_NOT_CHECKED = 3


def run_validate(args: argparse.Namespace) -> int:
    from raybricks.config import JobConfig
    from raybricks.pipeline import validate

    found = validate(JobConfig.load(args.config, args.set), source=not args.no_source)
    print(found.describe())
    return SOURCE_NOT_CHECKED if args.require_source and found.source_columns is None else 0


def add_score_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="models:/NAME@ALIAS")
    parser.add_argument("--input", required=True, help="table name or path")
    parser.add_argument("--output", required=True, help="table name or path")
    parser.add_argument("--probabilities", action="store_true",
                        help="classification: one probability column per class")
    add_intervals_argument(parser)


def add_intervals_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--intervals", action="store_true",
                        help="forecasting models trained with forecast.intervals: the "
                             "bounds lo_<level> and hi_<level> beside the prediction")


def run_score(args: argparse.Namespace) -> int:
    from raybricks.scoring import score

    summary = score(args.model, args.input, args.output, probabilities=args.probabilities,
                    intervals=args.intervals)
    print(summary)
    return 0


def add_forecast_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="models:/NAME@ALIAS")
    parser.add_argument("--output", required=True, help="table name or path")
    parser.add_argument("--horizon", type=int, default=None,
                        help="periods per segment (default: the model's horizon)")
    parser.add_argument("--segments", default=None,
                        help="only the segments of this table or path (its segment columns)")
    add_intervals_argument(parser)


def run_forecast(args: argparse.Namespace) -> int:
    from raybricks.scoring import forecast

    summary = forecast(args.model, args.output, horizon=args.horizon, segments=args.segments,
                       intervals=args.intervals)
    print(summary)
    return 0


def add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a key of the demo's job config")
    parser.add_argument("--forecast", action="store_true",
                        help="the forecasting demo (jobs/route_flights_forecast.yml)")


def run_demo(args: argparse.Namespace) -> int:
    from raybricks.flights_demo import run, run_forecast

    return (run_forecast if args.forecast else run)(overrides=args.set)


def add_submit_arguments(parser: argparse.ArgumentParser) -> None:
    from raybricks.submit import add_arguments

    add_arguments(parser)


def run_submit(args: argparse.Namespace) -> int:
    from raybricks.submit import run

    return run(args)


VERBS = {
    "train": ("train every segment as a job config says", add_train_arguments, run_train),
    "validate": ("check a job config, and its source where reachable, without Ray",
                 add_validate_arguments, run_validate),
    "score": ("score a table with a registered model", add_score_arguments, run_score),
    "forecast": ("forecast every segment of a registered forecasting model",
                 add_forecast_arguments, run_forecast),
    "demo": ("the end-to-end demo on local defaults", add_demo_arguments, run_demo),
    "submit": ("one-time run on a Databricks workspace", add_submit_arguments, run_submit),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raybricks", description="Train one model per segment with Ray on Spark."
    )
    verbs = parser.add_subparsers(dest="verb", required=True)
    for verb, (help_text, add_arguments, _) in VERBS.items():
        add_arguments(verbs.add_parser(verb, help=help_text, description=help_text))
    return parser


def main(argv: list[str] | None = None) -> int:
    from raybricks.errors import RaybricksError

    args = build_parser().parse_args(argv)
    try:
        return VERBS[args.verb][2](args)
    except RaybricksError as exc:
        print(f"raybricks {args.verb}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
