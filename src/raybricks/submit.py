"""``raybricks submit``: a one-time run of the training entry point on a workspace."""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="job config YAML")


def run(args: argparse.Namespace) -> int:
    print("raybricks submit: not yet available (the Databricks stage has not landed yet)",
          file=sys.stderr)
    return 2
