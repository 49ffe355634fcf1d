"""Errors raybricks raises on purpose: each names the problem and the fix."""


def key_text(row, columns: list[str]) -> str:
    """How a message names a segment: ``store='s1', item=7`` (``row``: a mapping or a
    Spark Row with those columns)."""
    return ", ".join(f"{c}={row[c]!r}" for c in columns)


def missing_columns(missing: list[str], names: list[str], where: str = "the data") -> str:
    """The message for columns the config names that ``where`` lacks: its columns, and
    for each missing one the column it likely meant (``segmented_model.column_hints``)."""
    from raybricks.segmented_model import column_hints

    return (f"column(s) {missing} not in {where}; it has {list(names)}"
            f"{column_hints(missing, names)}")


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message, for a message of one line (its type's name
    when it says nothing)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class RaybricksError(Exception):
    """Base class of every error raybricks raises deliberately."""


class ConfigError(RaybricksError, ValueError):
    """The job or cluster configuration is invalid."""


class SetupError(RaybricksError):
    """The machine lacks something raybricks needs (Java, a SparkSession, ...)."""


class ClusterError(RaybricksError):
    """Ray could not be started, sized or connected as asked."""


class DataError(RaybricksError, ValueError):
    """The input table cannot be turned into segments as asked."""


class WorkspaceError(RaybricksError):
    """A Databricks workspace call failed (not found, refused, timed out, server error)."""


class SourceNotFound(DataError):
    """The source table or path does not exist (or is not reachable from here)."""


class DataLostError(ClusterError):
    """Blocks of the job's data were lost with a Ray node: the run is kept, and resuming
    it (``training.resume``) trains the segments that have no result yet."""

    def __init__(self, message: str, run_id: str) -> None:
        super().__init__(message)
        self.run_id = run_id
