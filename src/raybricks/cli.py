"""The ``raybricks`` command: ``train | validate | score | forecast | monitor | demo |
submit``.

Each verb is a pair: a function that adds its arguments and one that runs it. A verb
prints its stages, progress and summary, then its wall time per stage, adding up to its
total from the command's start (``console.wall_time``); what Ray, Spark, MLflow and the
model libraries print goes to a log file (the run's ``raybricks.log`` for ``train``),
whose path is printed first (``--verbose``: shown live instead). Errors that are the
user's to fix (RaybricksError) print one message and exit 2; any other failure prints one
paragraph and the log's path and exits 1 (``--verbose``: with the traceback); Ctrl-C
shuts Ray and Spark down, keeps what finished and exits 130 (``train``: with the command
that resumes).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

from raybricks import console
from raybricks.console import say

#: Where verbs other than ``train`` keep their log files.
LOG_DIR = Path(".raybricks/logs")
#: The ``--model`` of the verbs that read a registered model.
MODEL_HELP = "models:/NAME@ALIAS (an alias) or models:/NAME/VERSION (a version)"
#: The exit code of a run stopped by Ctrl-C (128 + SIGINT, as shells report it).
INTERRUPTED = 130


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="job config YAML")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, e.g. --set training.resume=true")
    parser.add_argument("--segments", default=None, metavar="TABLE_OR_PATH",
                        help="train only the segments listed there (their segment "
                             "columns) and register a version that keeps the champion's "
                             "others: --set source.segments=...")
    parser.add_argument("--segments-from-monitor", default=None, metavar="RUN_OR_TABLE",
                        help="train only the segments a monitoring run (its MLflow run id) "
                             "or table found in --statuses, as --segments does")
    parser.add_argument("--statuses", default="degraded,new", metavar="S1,S2",
                        help="with --segments-from-monitor: the statuses to retrain "
                             "(default: degraded,new)")
    parser.add_argument("--global-model", choices=["keep", "refit"], default=None,
                        help="with --segments or --segments-from-monitor and fallback: "
                             "global: keep the champion's global model (the default; the "
                             "retrained segments blend with it) or refit it on the whole "
                             "source: --set global_model=...")
    parser.add_argument("--executor", choices=["auto", "ray", "spark"], default=None,
                        help="where the segments train: Ray on the Spark cluster, Spark's "
                             "own tasks (Spark Connect, serverless) or auto (the default): "
                             "--set training.executor=...")


def overrides(args: argparse.Namespace) -> list[str]:
    """The config overrides of ``--set``, ``--segments`` as ``source.segments`` and
    ``--segments-from-monitor`` as ``source.segments`` with ``source.statuses``."""
    if args.segments and args.segments_from_monitor:
        from raybricks.errors import ConfigError

        raise ConfigError("give --segments or --segments-from-monitor, not both")
    found = [*args.set, *([f"source.segments={args.segments}"] if args.segments else []),
             *([f"global_model={args.global_model}"] if args.global_model else []),
             *([f"training.executor={args.executor}"] if getattr(args, "executor", None)
               else [])]
    if args.segments_from_monitor:
        statuses = json.dumps([s.strip() for s in args.statuses.split(",") if s.strip()])
        found += [f"source.segments={args.segments_from_monitor}",
                  f"source.statuses={statuses}"]
    return found


def run_train(args: argparse.Namespace) -> int:
    from raybricks.config import JobConfig
    from raybricks.pipeline import LOG_FILE, train, with_run_id
    from raybricks.sources import NothingToTrain

    args.set = overrides(args)
    config = with_run_id(JobConfig.load(args.config, args.set))
    run_dir = Path(config.training.output_dir) / str(config.training.run_id)
    kept_sets = [s for s in args.set if s.split("=", 1)[0].strip()
                 not in ("training.resume", "training.run_id")]
    args.resume = " ".join(
        ["raybricks train --config", args.config, *[f"--set {s}" for s in kept_sets],
         "--set training.resume=true", f"--set training.run_id={config.training.run_id}"])
    args.kept = f"the results of the segments that finished are kept in {run_dir}"
    try:
        with logged(args, run_dir / LOG_FILE):
            report = train(config)
    except NothingToTrain as exc:  # a scheduled retrain when all is well: not a failure
        say(str(exc))
        return 0
    say(report.summary())
    say(f"results and models: {report.result.run_dir}")
    if report.publication is not None:
        say(report.publication.describe())
    say(report.wall_time())
    return 1 if report.result.counts()["trained"] == 0 else 0


@contextlib.contextmanager
def logged(args: argparse.Namespace, log_file: Path | None = None) -> Iterator[Path]:
    """Run the block with the libraries' output in ``log_file`` (default: one per verb
    and time under LOG_DIR), its path said first; a failure's traceback goes there, and
    only there (``main`` says what failed). SIGTERM stops the block as Ctrl-C does."""
    log_file = log_file or LOG_DIR / f"{args.verb}-{time.strftime('%Y%m%d-%H%M%S')}.log"
    args.log_file = log_file
    say(f"log: {log_file}" + (" (and here: --verbose)" if args.verbose else ""))
    with console.sigterm_as_interrupt(), console.libraries_to(log_file, args.verbose):
        try:
            yield log_file
        except BaseException:
            logging.getLogger("raybricks").exception("raybricks %s stopped", args.verb,
                                                     extra=console.LOG_ONLY)
            raise


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

    config = JobConfig.load(args.config, overrides(args))
    with logged(args):
        found = validate(config, source=not args.no_source)
    say(found.describe())
    say(found.wall_time())
    return SOURCE_NOT_CHECKED if args.require_source and found.source_columns is None else 0


def add_score_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help=MODEL_HELP)
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

    with logged(args):
        summary = score(args.model, args.input, args.output,
                        probabilities=args.probabilities, intervals=args.intervals)
    say(str(summary))
    say(summary.wall_time())
    return 0


def add_forecast_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help=MODEL_HELP)
    parser.add_argument("--output", required=True, help="table name or path")
    parser.add_argument("--horizon", type=int, default=None,
                        help="periods per segment (default: the model's horizon)")
    parser.add_argument("--segments", default=None,
                        help="only the segments of this table or path (its segment columns)")
    add_intervals_argument(parser)


def run_forecast(args: argparse.Namespace) -> int:
    from raybricks.scoring import forecast

    with logged(args):
        summary = forecast(args.model, args.output, horizon=args.horizon,
                           segments=args.segments, intervals=args.intervals)
    say(str(summary))
    say(summary.wall_time())
    return 0


def add_monitor_arguments(parser: argparse.ArgumentParser) -> None:
    from raybricks.monitoring import PERIODS, Thresholds

    defaults = Thresholds()
    parser.add_argument("--model", required=True, help=MODEL_HELP)
    parser.add_argument("--outcomes", required=True,
                        help="table or path of realized outcomes: the segment columns, the "
                             "actual target and the model's predictions (or the features: "
                             "raybricks scores them)")
    parser.add_argument("--output", required=True,
                        help="table or path of the monitoring table (one row per segment "
                             "and period)")
    parser.add_argument("--period", choices=PERIODS, default=None,
                        help="judge each segment per period of the time column (default: "
                             "all rows at once)")
    parser.add_argument("--time-column", default=None,
                        help="the outcomes' time column (default: the model's)")
    parser.add_argument("--target", default=None,
                        help="the actual target's column (default: the model's target)")
    parser.add_argument("--min-rows", type=int, default=defaults.min_rows,
                        help="fewest scored rows a period needs to be judged")
    parser.add_argument("--tolerance", type=float, default=defaults.tolerance,
                        help="degraded when realized error is worse than validation by "
                             "more than this share (and significantly)")
    parser.add_argument("--alpha", type=float, default=defaults.alpha,
                        help="significance level of the tests")
    parser.add_argument("--psi", type=float, default=defaults.psi,
                        help="a feature's PSI at least this (and significant): drifted")
    parser.add_argument("--no-run", action="store_true", help="do not log an MLflow run")


def run_monitor(args: argparse.Namespace) -> int:
    from raybricks.monitoring import Thresholds
    from raybricks.pipeline import monitor

    thresholds = Thresholds(args.min_rows, args.tolerance, args.alpha, args.psi)
    with logged(args):
        report = monitor(args.model, args.outcomes, args.output, period=args.period,
                         time_column=args.time_column, target=args.target,
                         thresholds=thresholds, log_run=not args.no_run)
    say(report.summary())
    say(report.wall_time())
    return 0


def add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a key of the demo's job config")
    parser.add_argument("--forecast", action="store_true",
                        help="the forecasting demo (jobs/route_flights_forecast.yml)")


def run_demo(args: argparse.Namespace) -> int:
    from raybricks.flights_demo import run, run_forecast

    with logged(args):
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
    "monitor": ("per-segment realized error, drift and status of a registered model on "
                "outcomes", add_monitor_arguments, run_monitor),
    "demo": ("the end-to-end demo on local defaults", add_demo_arguments, run_demo),
    "submit": ("one-time run on a Databricks workspace", add_submit_arguments, run_submit),
}


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose "invalid choice" (a verb, a flag's value) names the
    choice it likely meant."""

    def error(self, message: str) -> NoReturn:
        import re

        from raybricks.kinds import did_you_mean

        found = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if found:
            choices = [c.strip(" '") for c in found.group(2).split(",")]
            hint = did_you_mean(found.group(1), choices, n=1)
            message += f": {hint}" if hint else ""
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="raybricks", description="Train one model per segment with Ray on Spark."
    )
    verbs = parser.add_subparsers(dest="verb", required=True)
    for verb, (help_text, add_arguments, _) in VERBS.items():
        verb_parser = verbs.add_parser(verb, help=help_text, description=help_text)
        add_arguments(verb_parser)
        if verb != "submit":
            verb_parser.add_argument(
                "--master", default=None,
                help="the Spark master when no session is active (e.g. spark://host:7077, "
                     "local-cluster[2,2,2048]); default: SPARK_MASTER, PYSPARK_SUBMIT_ARGS' "
                     "--master, spark-defaults.conf, else local[N]")
        verb_parser.add_argument(
            "--verbose", action="store_true",
            help="show what Ray, Spark, MLflow and the libraries log as it comes, and a "
                 "failure's traceback")
    return parser


def main(argv: list[str] | None = None) -> int:
    from raybricks.errors import DataLostError, RaybricksError

    args = build_parser().parse_args(argv)
    args.log_file = args.resume = args.kept = None
    use_master(args)
    try:
        with console.command():  # a verb's wall time counts from here
            return VERBS[args.verb][2](args)
    except KeyboardInterrupt:
        return interrupted(args)
    except Exception as exc:  # noqa: BLE001 - one message or paragraph, not a traceback
        if after_interrupt(exc):
            return interrupted(args)
        if isinstance(exc, RaybricksError):
            log = f"\nlog: {args.log_file}" if args.log_file else ""
            go_on = (f"\nTo continue where it stopped: {args.resume}"
                     if isinstance(exc, DataLostError) and args.resume else "")
            print(f"raybricks {args.verb}: {exc}{go_on}{log}", file=sys.stderr)
            return 2
        print(failure_paragraph(args, exc), file=sys.stderr)
        if args.verbose:
            import traceback

            traceback.print_exc()
        return 1


def use_master(args: argparse.Namespace) -> None:
    """``--master``: the job config's ``spark.master`` (it wins over the file's) and
    ``SPARK_MASTER`` for the verbs without a job config."""
    master = getattr(args, "master", None)
    if master:
        os.environ["SPARK_MASTER"] = master
        if isinstance(getattr(args, "set", None), list):
            args.set.append(f"spark.master={master}")


def interrupted(args: argparse.Namespace) -> int:
    """After Ctrl-C or SIGTERM: stop Spark, say what was kept and how to resume."""
    stop_spark()
    lines = [f"raybricks {args.verb}: interrupted. Ray and Spark were shut down"
             + (f"; {args.kept}" if args.kept else "") + "."]
    if args.resume:
        lines.append(f"To continue where it stopped: {args.resume}")
    print("\n".join(lines), file=sys.stderr)
    return INTERRUPTED


def after_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` came while a KeyboardInterrupt was handled: clean-up that Ctrl-C
    or SIGTERM cut short failing in turn (a Spark call interrupted half-way leaves its
    connection to the JVM broken for the next call, in a ``finally``, say)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        found = todo.pop()
        if found is None or id(found) in seen:
            continue
        if isinstance(found, KeyboardInterrupt):
            return True
        seen.add(id(found))
        todo += [found.__context__, found.__cause__]
    return False


def failure_paragraph(args: argparse.Namespace, exc: BaseException) -> str:
    """What failed, the likely cause, what to do, and where the log is."""
    first = (str(exc).strip().splitlines() or [""])[0]
    where = (f"The log {args.log_file} has the traceback and everything Ray, Spark and "
             "MLflow printed" if args.log_file else "")
    return (f"raybricks {args.verb} failed: {type(exc).__name__}: {first}\n"
            "This is not a config or data problem raybricks checks for: the likely cause "
            "is the environment (a library version it does not support, memory or disk "
            "running out, a service it needs not answering). "
            + (f"{where}; " if where else "")
            + ("the traceback is above. " if args.verbose else
               "rerun with --verbose to see it here. ")
            + "If it persists, report it with the log.")


def stop_spark() -> None:
    """Stop this process' Spark session, if any (after Ctrl-C)."""
    with contextlib.suppress(Exception):
        from raybricks.session import active_spark

        spark = active_spark()
        if spark is not None:
            spark.stop()


def run() -> None:
    """The ``raybricks`` command: ``main``, then exit with its code. An interrupted run
    ends without the interpreter's finalization once its message is out: Ray, gRPC and
    Py4J threads cut short mid-start can crash there (SIGSEGV instead of exit 130)."""
    code = main()
    if code == INTERRUPTED:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    run()
