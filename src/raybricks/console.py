"""What a person sees of a run: one line per stage as it starts and ends (with its
seconds), tqdm's progress bars, the summary; and, kept aside, what Ray, Spark, MLflow and
the model libraries print.

``stage(name)`` times a stage and says so (``quiet()`` turns the lines off, as
``training.progress: false`` does); ``say`` prints a line of raybricks' own. A verb runs
inside ``clock()``: its top-level stages and the time outside them (``other``) add up to
its wall time, measured from its start (the CLI's: from the command's, ``command()``),
and ``wall_time`` says so in one line; ``spark_session`` starts Spark as a stage of its
own when no session is given or active.

The CLI runs its verb inside ``libraries_to(log_file)``: file descriptors 1 and 2, which
the Spark JVM, Ray's processes and every library writing to the terminal inherit or use,
go to the log file, and so do Python's logging and warnings; raybricks' lines and bars
keep the terminal. In a notebook (or under ``--verbose``) nothing is redirected: the API
shows its stage lines and tqdm's notebook bar.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from raybricks.config import SparkConfig

_terminal: TextIO | None = None  # raybricks' own output while libraries are redirected
_quiet = False
_depth = 0  # stages open now
#: The time outside a verb's stages, in its ``timings``.
OTHER = "other"
#: The CLI's time before its verb's clock: imports, the log file (in its ``timings``).
START_UP = "start-up"


def terminal() -> TextIO:
    """Where raybricks' own lines and progress bars go."""
    return _terminal or sys.stdout


def say(line: str) -> None:
    """A line of raybricks' own output."""
    print(line, file=terminal(), flush=True)


@contextlib.contextmanager
def quiet(enabled: bool = True) -> Iterator[None]:
    """No stage lines inside (``enabled``), as with ``training.progress: false``."""
    global _quiet
    before, _quiet = _quiet, _quiet or enabled
    try:
        yield
    finally:
        _quiet = before


def progress_bar(total: int | None, desc: str, unit: str, enabled: bool = True):
    """tqdm's bar (its notebook widget in a notebook) on raybricks' terminal: done of
    ``total``, rate and time left; off when ``enabled`` is false or inside ``quiet()``."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=_quiet or not enabled,
                smoothing=0.1, mininterval=0.5, file=terminal(), unit_scale=unit == "row")


@contextlib.contextmanager
def spark_progress(spark, total: int | None, desc: str, unit: str = "row"
                   ) -> Iterator[None]:
    """A progress bar of ``total`` units while the block runs Spark jobs, advanced by the
    share of their tasks that are done (polled from Spark's status tracker); of the
    tasks themselves when ``total`` is unknown (None)."""
    import threading
    import uuid

    context = spark.sparkContext
    group = f"raybricks-{uuid.uuid4().hex[:8]}"
    context.setJobGroup(group, desc)
    tracker = context.statusTracker()
    stop = threading.Event()
    with progress_bar(total, desc, unit if total is not None else "task") as bar:
        def poll() -> None:
            while not stop.wait(0.5):
                done = tasks = 0
                for job in tracker.getJobIdsForGroup(group):
                    info = tracker.getJobInfo(job)
                    for stage_id in info.stageIds if info else []:
                        found = tracker.getStageInfo(stage_id)
                        if found:
                            done, tasks = done + found.numCompletedTasks, tasks + found.numTasks
                if tasks and total is None:
                    bar.total = tasks
                if tasks:
                    bar.update(max(int((total or tasks) * done / tasks) - bar.n, 0))

        watcher = threading.Thread(target=poll, daemon=True)
        watcher.start()
        try:
            yield
            bar.update(max((bar.total or 0) - bar.n, 0))
        finally:
            stop.set()
            watcher.join()
            context.setLocalProperty("spark.jobGroup.id", None)
            context.setLocalProperty("spark.job.description", None)


@dataclass
class Clock:
    """A verb's wall time from its ``start`` and the seconds of its top-level stages (those
    opened at ``depth``: a stage inside one of them is part of it), in order."""

    start: float
    depth: int
    stages: dict[str, float] = field(default_factory=dict)

    def seconds(self) -> float:
        """The wall time so far."""
        return time.perf_counter() - self.start

    def timings(self, seconds: float | None = None) -> dict[str, float]:
        """The stages and ``other``, the time outside them, adding up to ``seconds``
        (default: the wall time so far)."""
        seconds = self.seconds() if seconds is None else seconds
        return {**self.stages, OTHER: max(seconds - sum(self.stages.values()), 0.0)}


_clocks: list[Clock] = []  # the clocks open now, the innermost last
_command_start: float | None = None  # the CLI's command, until its verb's clock takes it


@contextlib.contextmanager
def command() -> Iterator[None]:
    """The CLI's command runs in the block: the first verb's clock counts from here when
    nothing (no stage) ran before it; the time until then is its ``start-up``."""
    global _command_start
    _command_start = time.perf_counter()
    try:
        yield
    finally:
        _command_start = None


@contextlib.contextmanager
def clock() -> Iterator[Clock]:
    """A verb's clock: its stages from here on, and the wall time from here (the CLI
    command's start, when the verb is the command's and nothing ran before it)."""
    global _command_start
    now = time.perf_counter()
    found = Clock(now, _depth)
    if _command_start is not None and not _clocks and _depth == 0:
        found.start, found.stages[START_UP] = _command_start, now - _command_start
    _command_start = None
    _clocks.append(found)
    try:
        yield found
    finally:
        _clocks.remove(found)


def wall_time(timings: dict[str, float], seconds: float) -> str:
    """``wall time per stage (s): spark 4.3, ...; total 69.4``: the seconds to a tenth,
    those of the stages adding up to the total's (the tenths rounding lost go to the
    stages that lost the most)."""
    tenths = {name: value * 10 for name, value in timings.items()}
    shown = {name: math.floor(value) for name, value in tenths.items()}
    lost = round(seconds * 10) - sum(shown.values())
    for name in sorted(tenths, key=lambda n: shown[n] - tenths[n])[:max(lost, 0)]:
        shown[name] += 1
    return ("wall time per stage (s): "
            + ", ".join(f"{name} {value / 10:.1f}" for name, value in shown.items())
            + f"; total {round(seconds * 10) / 10:.1f}")


def spark_session(spark: SparkSession | None = None, config: SparkConfig | None = None,
                  timings: dict[str, float] | None = None) -> SparkSession:
    """``spark``, else the active session, else one raybricks starts (``config``): a stage
    of its own, ``spark``; a given or active session costs nothing (on Spark Connect, its
    workers are asked once whether they import raybricks: ``workers.ship_to_workers``)."""
    from raybricks.workers import ship_to_workers

    if spark is None and "pyspark" in sys.modules:  # else none can be active yet
        from raybricks.session import active_spark

        spark = active_spark()
    if spark is None:
        from raybricks.cluster import spark_session as started

        with stage("spark", timings, "Spark: start a session"):
            spark = started(config)
    ship_to_workers(spark)  # Spark Connect workers without raybricks get the driver's
    return spark


@contextlib.contextmanager
def stage(name: str, timings: dict[str, float] | None = None, says: str | None = None
          ) -> Iterator[None]:
    """Say the stage (``says``, else its ``name``) starts, then that it ended (or
    stopped) after how many seconds; its seconds go into ``timings[name]`` and, for a
    verb's top-level stage, its clock's."""
    global _depth, _command_start
    start = time.perf_counter()
    label, indent = says or name, "  " * _depth  # a stage inside another is indented
    owner = _clocks[-1] if _clocks and _clocks[-1].depth == _depth else None
    _command_start = None  # something ran before any verb's clock: not its start-up
    if not _quiet:
        say(f"{indent}> {label} ...")
    _depth += 1
    try:
        yield
    except BaseException:
        if not _quiet:
            say(f"{indent}x {label}: stopped after {time.perf_counter() - start:.1f} s")
        raise
    finally:
        _depth -= 1
        seconds = time.perf_counter() - start
        if owner is not None:
            owner.stages[name] = owner.stages.get(name, 0.0) + seconds
    if timings is not None:
        timings[name] = seconds
    if not _quiet:
        say(f"{indent}  {label}: {seconds:.1f} s")


LIBRARY_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: The loggers a run keeps in its log file: raybricks', the libraries that print to the
#: terminal with handlers of their own, and Python's warnings.
LOGGED = ("raybricks", "ray", "mlflow", "py.warnings")
_verbose = False
_log_files: list[logging.Handler] = []  # the file handlers of the logging_to blocks open


#: ``extra=`` of a record for the log file only, never the terminal (a failure's traceback,
#: which the CLI sums up in one message).
LOG_ONLY = {"log_only": True}


class TerminalHandler(logging.Handler):
    """raybricks' own log records, on raybricks' terminal (as it is when they come), but
    those logged with ``extra=LOG_ONLY``."""

    def __init__(self, level: int) -> None:
        super().__init__(level)
        self.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
        self.addFilter(lambda record: not getattr(record, "log_only", False))

    def emit(self, record: logging.LogRecord) -> None:
        say(self.format(record))


class LogFileHandler(logging.FileHandler):
    """A log file in raybricks' format, whoever sets a formatter on it later (``ray.init``
    sets its own on every handler of the ``ray`` logger)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, encoding="utf-8")
        super().setFormatter(logging.Formatter(LIBRARY_LOG_FORMAT))

    def setFormatter(self, fmt: logging.Formatter | None) -> None:  # noqa: N802
        """Keep raybricks' format."""


@contextlib.contextmanager
def logging_to(log_file: Path) -> Iterator[None]:
    """The LOGGED loggers (INFO and above) and warnings go to ``log_file`` (appended),
    and nowhere else, inside the block; under ``libraries_to(..., verbose=True)`` they
    are shown as they come too. Other loggers (and the root's level) are left alone."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    handler = LogFileHandler(log_file)
    import mlflow  # noqa: F401  # importing them sets their loggers' handlers (replacing or
    import ray  # noqa: F401  # adding to ours): done before the swap, not inside the block

    loggers = [logging.getLogger(name) for name in LOGGED]
    if any(getattr(h, "baseFilename", None) == handler.baseFilename
           for h in loggers[0].handlers):  # already logging there (the CLI's train)
        handler.close()
        yield
        return
    saved = [(logger.handlers[:], logger.propagate, logger.level) for logger in loggers]
    nested = bool(_log_files)  # inside another block (the CLI's): its log keeps its lines
    shown = TerminalHandler(logging.INFO if _verbose else logging.WARNING)
    for logger in loggers:
        # raybricks' warnings are shown (all its lines with --verbose); with --verbose the
        # libraries' own handlers stay too
        ours = [shown] if logger.name == "raybricks" and not nested else []
        if _verbose or nested:
            logger.handlers = logger.handlers + [handler] + ours
        else:
            logger.handlers, logger.propagate = [handler, *ours], False
        if logger.level == logging.NOTSET or logger.level > logging.INFO:
            logger.setLevel(logging.INFO)
    _log_files.append(handler)
    with warnings.catch_warnings():
        logging.captureWarnings(True)
        try:
            yield
        finally:
            _log_files.remove(handler)
            logging.captureWarnings(nested)
            for logger, (handlers, propagate, level) in zip(loggers, saved, strict=True):
                logger.handlers, logger.propagate = handlers, propagate
                logger.setLevel(level)
            handler.close()


@contextlib.contextmanager
def libraries_to(log_file: Path, verbose: bool = False) -> Iterator[Path]:
    """Run the block with everything but raybricks' own output in ``log_file`` (appended):
    file descriptors 1 and 2 (what child processes inherit, and what libraries print),
    Python's logging and warnings (``logging_to``). ``verbose``: the terminal shows it
    all as it comes, the log file gets Python's logging."""
    global _terminal, _verbose
    saved: tuple[int, int] | None = None
    _verbose = verbose
    try:
        with logging_to(log_file):
            if not verbose:
                for stream in (sys.stdout, sys.stderr):
                    stream.flush()
                saved = os.dup(1), os.dup(2)
                # what writes to the terminal itself keeps it; what was captured stays so
                _terminal = (open(os.dup(saved[0]), "w", buffering=1, encoding="utf-8")  # noqa: SIM115
                             if sys.stdout is sys.__stdout__ else sys.stdout)
                with open(log_file, "a", encoding="utf-8") as sink:
                    os.dup2(sink.fileno(), 1)  # sys.__stdout__, sys.__stderr__ write here too
                    os.dup2(sink.fileno(), 2)
            yield log_file
    finally:
        if saved is not None:
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            if _terminal is not sys.stdout and _terminal is not None:
                _terminal.close()
        _terminal, _verbose = None, False


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[Callable[[], None]]:
    """SIGTERM raises KeyboardInterrupt in the block, so that clean-up runs as after
    Ctrl-C; so does Ray's own SIGTERM exit (``ray.init`` installs a handler that raises
    SystemExit(15)). Yields a function that installs the handler again (after
    ``ray.init`` replaced it); the handler of before is restored at the end. Off the main
    thread, which cannot set handlers, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: None
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    def install() -> None:
        signal.signal(signal.SIGTERM, interrupt)

    previous = signal.getsignal(signal.SIGTERM)
    install()
    try:
        yield install
    except SystemExit as exc:
        if exc.code != signal.SIGTERM:
            raise
        raise KeyboardInterrupt(f"signal {exc.code}") from exc
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
