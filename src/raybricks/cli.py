"""The ``raybricks`` command: ``train | score | demo | submit``."""

from __future__ import annotations

import argparse
import sys

NOT_YET = "raybricks {verb}: not yet available (the {stage} stage has not landed yet)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raybricks", description="Train one model per segment with Ray on Spark."
    )
    verbs = parser.add_subparsers(dest="verb", required=True)
    train = verbs.add_parser("train", help="train every segment as a job config says")
    train.add_argument("--config", required=True, help="job config YAML")
    train.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    score = verbs.add_parser("score", help="score a table with a registered model")
    score.add_argument("--model", required=True, help="models:/NAME@ALIAS")
    score.add_argument("--input", required=True, help="table name or path")
    score.add_argument("--output", required=True, help="table name or path")
    verbs.add_parser("demo", help="the end-to-end demo on local defaults")
    submit = verbs.add_parser("submit", help="one-time run on a Databricks workspace")
    submit.add_argument("--config", required=True)
    return parser


def run_train(args: argparse.Namespace) -> int:
    from raybricks.config import JobConfig
    from raybricks.pipeline import train

    config = JobConfig.load(args.config, args.set)
    result = train(config)
    print(result.summary())
    print(f"results and models: {result.run_dir}")
    return 1 if result.counts()["trained"] == 0 else 0


def main(argv: list[str] | None = None) -> int:
    from raybricks.errors import RaybricksError

    args = build_parser().parse_args(argv)
    if args.verb == "train":
        try:
            return run_train(args)
        except RaybricksError as exc:
            print(f"raybricks train: {exc}", file=sys.stderr)
            return 2
    stages = {"score": "scoring", "demo": "demo", "submit": "Databricks"}
    print(NOT_YET.format(verb=args.verb, stage=stages[args.verb]), file=sys.stderr)
    return 0 if args.verb == "demo" else 2


if __name__ == "__main__":
    sys.exit(main())
