"""Faults on a real multi-executor Spark: executors and Ray nodes killed, SIGTERM.

Each test runs ``raybricks train`` in a process group of its own on
``local-cluster[2,2,1024]`` (a standalone master and worker in the driver's JVM, two
executor JVMs of two cores; Ray on Spark puts one Ray worker node of one CPU in each), so
it never touches the suite's shared session. Faults are real: an executor JVM or a Ray
node's raylet is SIGKILLed, the driver gets SIGTERM. Every process a test starts is
killed in its ``finally``, whatever happened.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

from tests import faults

pytestmark = [pytest.mark.topology, pytest.mark.heavy, pytest.mark.cluster_only]

REPO = Path(__file__).resolve().parents[1]
MASTER = "local-cluster[2,2,1024]"
EXECUTOR = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
RAYLET = "/raylet/raylet"
#: The longest any one step (Spark and Ray starting, training) may take on a busy machine.
STEP_S = 300


def slow_fit(X: pd.DataFrame, y, params: dict):
    """A user model (kind=function) that takes ``params["sleep"]`` seconds per fit, so
    training lasts long enough to be hit, however busy the machine."""
    time.sleep(float(params["sleep"]))
    return faults.fit_with_faults(X, y, params)


# --------------------------------------------------------------------------- processes


def processes() -> dict[int, tuple[int, int, str, str]]:
    """Every process now: pid -> (parent pid, process group, start time, command line)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        found[int(entry.name)] = (int(fields[1]), int(fields[2]), fields[19], command)
    return found


def descendants(root: int, table: dict[int, tuple[int, int, str, str]]) -> dict[int, str]:
    """The processes under ``root`` (children, their children, ...): pid -> command."""
    children: dict[int, list[int]] = {}
    for pid, (parent, *_) in table.items():
        children.setdefault(parent, []).append(pid)
    found, todo = {}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found[child] = table[child][3]
            todo.append(child)
    return found


class Train:
    """``raybricks train`` (``command``) in a process group of its own, its output in
    files; every process seen under it, and every one whose command line names
    ``marker`` (the job's folder, which holds Ray's temp dir), is remembered, to check
    that they are gone and to kill them in the end."""

    def __init__(self, tmp_path: Path, command: list[str], name: str, marker: str) -> None:
        self.name, self.tmp_path, self.marker = name, tmp_path, marker
        self.seen: dict[int, tuple[str, str]] = {}  # pid -> (start time, command)
        # not the suite's Ray (RAY_ADDRESS, set by its Ray on Spark): the run starts its own
        env = {k: v for k, v in os.environ.items()
               if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS", "RAYBRICKS_TEST_MASTER")}
        env |= {"PYTHONPATH": str(REPO), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db"}
        self.out = (tmp_path / f"{name}.out").open("w")
        self.err = (tmp_path / f"{name}.err").open("w")
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "raybricks.cli", *command[1:]],
            stdout=self.out, stderr=self.err, cwd=tmp_path, env=env, text=True,
            start_new_session=True)

    def look(self) -> dict[int, str]:
        """The processes of the run now (remembered): pid -> command."""
        table = processes()
        now = descendants(self.process.pid, table)
        now |= {pid: command for pid, (*_, command) in table.items() if self.marker in command}
        for pid, command in now.items():
            self.seen.setdefault(pid, (table[pid][2], command))
        return now

    def left(self) -> dict[int, str]:
        """The remembered processes still running (same pid and start time)."""
        table = processes()
        return {pid: command for pid, (start, command) in self.seen.items()
                if pid in table and table[pid][2] == start}

    def executors(self) -> dict[int, str]:
        return {pid: c for pid, c in self.look().items() if EXECUTOR in c}

    def wait_for(self, what: str, found: Callable[[], object], timeout: float = STEP_S,
                 poll: float = 0.1):
        """``found()``'s first true value, looked for every ``poll`` seconds while the
        run goes on (it must not end first)."""
        deadline = time.monotonic() + timeout
        while True:
            self.look()
            value = found()
            if value:
                return value
            assert self.process.poll() is None, f"{self.name} ended before {what}: {self.tail()}"
            assert time.monotonic() < deadline, f"no {what} within {timeout} s: {self.tail()}"
            time.sleep(poll)

    def log(self) -> str:
        logs = list(self.tmp_path.glob("runs/*/raybricks.log"))
        return "\n".join(p.read_text(errors="replace") for p in logs)

    def text(self) -> tuple[str, str]:
        self.out.flush()
        self.err.flush()
        return ((self.tmp_path / f"{self.name}.out").read_text(),
                (self.tmp_path / f"{self.name}.err").read_text())

    def tail(self) -> str:
        out, err = self.text()
        return f"\nstdout: {out[-2000:]}\nstderr: {err[-3000:]}"

    def finish(self, timeout: float = STEP_S) -> int:
        """Wait for the run to end; its exit code."""
        deadline = time.monotonic() + timeout
        while self.process.poll() is None:
            assert time.monotonic() < deadline, f"{self.name} still running: {self.tail()}"
            self.look()
            time.sleep(0.2)
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL the process group (while it is surely the run's: the process or a
        member of its group still runs) and every process of the run still running."""
        group = self.process.pid
        if self.process.poll() is None or any(g == group for _, g, _, _ in processes().values()):
            with _quiet():
                os.killpg(group, signal.SIGKILL)
        self.look()
        for pid in self.left():
            with _quiet():
                os.kill(pid, signal.SIGKILL)
        self.process.wait(timeout=30)
        self.out.close()
        self.err.close()


def _quiet() -> contextlib.suppress:
    """Ignore a process that is gone already (or is no longer ours to signal)."""
    return contextlib.suppress(ProcessLookupError, PermissionError)


def gone_within(run: Train, seconds: float) -> dict[int, str]:
    """The run's processes still running ``seconds`` after it ended (none, at best)."""
    deadline = time.monotonic() + seconds
    while (left := run.left()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


# --------------------------------------------------------------------------- the job


def make_job(tmp_path: Path, stores: int, rows: int, sleep: float) -> Path:
    """A job of ``stores`` segments of ``rows`` rows whose fits take ``sleep`` s each,
    staged through Parquet (its blocks then live in the Ray worker nodes' object stores,
    not the driver's); its config, Ray's temp dir and the staging dir in a short folder
    of their own (Unix socket paths are short), which every Ray process names."""
    source = tmp_path / "stores.parquet"
    faults.stores({}, regular=stores, rows=rows).to_parquet(source)
    folder = Path(tempfile.mkdtemp(prefix="rbtf-", dir="/tmp"))
    config = folder / "job.yml"
    config.write_text(f"""
source: {{path: "{source}", format: parquet}}
segment_by: [store]
target: y
features: [x1, fault]
models:
  - {{name: slow, kind: function, function: tests.test_topology_faults.slow_fit,
     params: {{sleep: {sleep}}}}}
min_rows: 10
data: {{strategy: parquet, staging_dir: "{folder / 'staging'}"}}
cluster: {{temp_dir: "{folder / 'ray'}"}}
registry: {{name: tests.topology.faults}}
training: {{output_dir: "{tmp_path / 'runs'}"}}
""")
    return config


def results(run_dir: Path) -> pd.DataFrame:
    """Every result row of the run (one per segment that has one)."""
    parts = sorted((run_dir / "results").glob("*.parquet"))
    return pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True) if parts \
        else pd.DataFrame(columns=["store", "status"])


@pytest.fixture
def job_folder():
    """Where make_job puts the config, Ray's temp dir and the staging; removed after."""
    made = set(Path("/tmp").glob("rbtf-*"))
    yield
    for folder in set(Path("/tmp").glob("rbtf-*")) - made:
        shutil.rmtree(folder, ignore_errors=True)


def resume_command(err: str) -> list[str]:
    """The command ``raybricks train`` printed to continue the run."""
    found = re.search(r"To continue where it stopped: (raybricks train .*)$", err, re.M)
    assert found, err[-3000:]
    return found.group(1).split()


def ray_tasks(run: Train) -> dict[int, set[str]]:
    """Per executor of the run, the Ray tasks running inside it now (the ``ray::NAME``
    process titles of its Ray node's workers)."""
    table = processes()
    return {executor: {c.split()[0][5:] for c in descendants(executor, table).values()
                       if c.startswith("ray::")} for executor in run.executors()}


def worker_raylets(run: Train) -> dict[int, int]:
    """The raylets of the run's Ray worker nodes (those inside executors): pid -> executor."""
    table = processes()
    return {pid: executor for executor in run.executors()
            for pid, command in descendants(executor, table).items() if RAYLET in command}


# --------------------------------------------------------------------------- tests


def test_an_executor_killed_mid_training_loses_no_segment_and_resume_finishes_the_job(
        tmp_path, job_folder):
    """An executor JVM SIGKILLed while its Ray node trains takes the node, and the blocks
    in its object store, with it (the killed one is one whose node read blocks). Ray
    retries the lost tasks on the other node; a block it cannot rebuild (the staged files
    are gone) fails none of its segments: they get no result, every other segment trains,
    and the job stops (exit 2) saying how to resume. Resuming reads the source again and
    trains exactly the missing ones. (Had the other node a copy of every block, the job
    would succeed at once: that is checked as strictly, if it happens.)"""
    config = make_job(tmp_path, stores=48, rows=1000, sleep=0.2)
    command = ["raybricks", "train", "--config", str(config), "--master", MASTER,
               "--set", "training.run_id=lost", "--set", "training.executor=ray"]
    run_dir = tmp_path / "runs" / "lost"

    killed = Train(tmp_path, command, "killed", str(config.parent))
    readers: set[int] = set()  # executors whose Ray node read blocks: they hold them

    def training() -> list[int]:
        running = ray_tasks(killed)
        readers.update(e for e, names in running.items() if "_read_parquet_blocks" in names)
        return [e for e, names in running.items() if "train_block" in names]
    try:
        busy = killed.wait_for("a training task in an executor", training, poll=0.05)
        nodes = worker_raylets(killed)
        # one that holds blocks; then one that trains; Spark may start both Ray nodes (1
        # CPU each) in one executor (2 cores): one of a single node first, if any
        victim = min(killed.executors(), key=lambda e: (
            e not in readers, e not in busy, list(nodes.values()).count(e) != 1))
        raylets = [r for r, e in nodes.items() if e == victim]
        trained_before = len(results(run_dir))
        os.kill(victim, signal.SIGKILL)
        at = time.monotonic()
        while set(raylets) & set(killed.left()) and time.monotonic() < at + 30:
            time.sleep(0.05)
        node_gone_s = time.monotonic() - at
        code = killed.finish()
        ended_s = time.monotonic() - at
        out, err = killed.text()
        left = gone_within(killed, 10)
    finally:
        killed.kill()
    got = results(run_dir)
    missing = 48 - len(got)
    print(f"executor {victim} (read blocks: {victim in readers}, trained: {victim in busy}) "
          f"killed with {len(raylets)} of the {len(nodes)} Ray worker nodes: their raylets "
          f"gone after {node_gone_s:.1f} s; exit {code} {ended_s:.1f} s later; "
          f"{trained_before} trained before, {len(got)} after, {missing} left")
    assert raylets and node_gone_s < 30, "the killed executor's Ray node lived on"
    assert not got.store.duplicated().any() and (got.status == "trained").all(), got
    assert not left, left
    if code == 0:  # no block was lost (the other node had a copy of each): all retried
        assert "48 trained, 0 skipped, 0 failed" in out, killed.tail()
        assert missing == 0
        return
    assert code == 2, killed.tail()
    assert 0 < missing <= 48 - trained_before, (trained_before, len(got))
    assert err.startswith(
        f"raybricks train: {missing} of 48 segments were not trained: their data was lost "
        "with a Ray worker node"), err[-3000:]
    assert f"the results so far are kept in {run_dir}" in err and "Traceback" not in err
    assert "rerun with --set training.resume=true --set training.run_id=lost\n" in err
    assert "\nTo continue where it stopped: raybricks train --config " in err
    assert "registry:" not in out

    resumed = Train(tmp_path, [*command, "--set", "training.resume=true"], "resumed",
                    str(config.parent))
    try:
        code = resumed.finish()
        out, err = resumed.text()
        left = gone_within(resumed, 10)
    finally:
        resumed.kill()
    assert code == 0, resumed.tail()
    assert f"training 48 segments (0 large, {48 - missing} done before)" in resumed.log()
    assert "48 trained, 0 skipped, 0 failed" in out
    assert "accounting: 48 segments in the source = trained + skipped + failed" in out
    assert "registered tests.topology.faults version 1" in out
    got = results(run_dir)
    assert sorted(got.store) == sorted(f"s{i}" for i in range(48))
    assert (got.status == "trained").all()
    assert not left, left


# extended: ~3 min; the executor killed mid-training above runs in CI
@pytest.mark.extended
def test_a_ray_node_killed_while_ray_starts_is_replaced_and_sigterm_in_a_spark_job_stops_all(
        tmp_path, job_folder):
    """The first Ray worker node's raylet, SIGKILLed while ``setup_ray_cluster`` waits for
    the worker nodes: Ray on Spark's autoscaler starts another in a new Spark job and Ray
    comes up with two. Then SIGTERM while Spark writes the staged source (a Spark job
    while Ray holds its slots): the run ends within seconds with 130 and the command that
    resumes it, and nothing of it is left running: no Ray process of its temp dir, no
    executor, no driver JVM (which holds local-cluster's master and worker)."""
    config = make_job(tmp_path, stores=48, rows=1000, sleep=0.2)
    staging = config.parent / "staging"
    command = ["raybricks", "train", "--config", str(config), "--master", MASTER,
               "--set", "training.run_id=sigterm", "--set", "training.executor=ray"]
    run = Train(tmp_path, command, "sigterm", str(config.parent))
    try:
        first = run.wait_for("a Ray worker node's raylet", lambda: next(
            iter(worker_raylets(run)), None), poll=0.05)
        starting = run.text()[0]
        os.kill(first, signal.SIGKILL)
        at = time.monotonic()
        run.wait_for("Spark writing the staged source",
                     lambda: any(staging.glob("*/_temporary")), poll=0.02)
        live = worker_raylets(run)
        up_s = time.monotonic() - at
        run.process.send_signal(signal.SIGTERM)
        at = time.monotonic()
        code = run.finish(timeout=60)
        ended_s = time.monotonic() - at
        left = gone_within(run, 5)
        out, err = run.text()
    finally:
        run.kill()
    print(f"raylet {first} killed; Ray up and Spark writing {up_s:.1f} s later with worker "
          f"raylets {sorted(live)}; SIGTERM: exit {code} after {ended_s:.1f} s; left {left}")
    assert "> Ray: start (on Spark) or connect ..." in starting
    assert "Ray: start (on Spark) or connect:" not in starting  # it was still starting
    assert first not in live and len(live) == 2  # a node of its own took its place
    assert re.search(r"^  Ray: start \(on Spark\) or connect: [\d.]+ s$", out, re.M), out
    assert code == 130, run.tail()
    assert ended_s < 15
    assert "x data: the source as Ray blocks by segment: stopped after" in out
    assert resume_command(err) == [*command[:4], "--set", "training.executor=ray", "--set",
                                   f"spark.master={MASTER}", "--set",
                                   "training.resume=true", "--set", "training.run_id=sigterm"]
    assert "Traceback" not in err
    assert not left, left
