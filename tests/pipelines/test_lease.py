"""The gate's lease, kept in the registry: one holder at a time, a crashed holder's lease
taken over after lease_s, and a holder stalled past it told so before it moves an alias.

Holders are real processes on the test's embedded registry (SQLite in TRAINFLOW_HOME);
tests/e2e/test_team_gate.py races them on an MLflow server, from homes of their own."""

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from trainflow.pipelines.registry import lease, store, versions
from trainflow.workspace import workspace

# Takes the lease on "toy", says so, then waits for a line on stdin before its fencing
# check, whose outcome it prints.
HOLDER = """\
import sys
from trainflow.pipelines.registry.lease import LeaseLost, model_lease
from trainflow.pipelines.registry.store import client
from trainflow.workspace import workspace

ws = workspace()
with model_lease(client(ws), ws, "toy", lease_s=float(sys.argv[1])) as held:
    print("HOLDING", held.ticket, flush=True)
    sys.stdin.readline()
    try:
        held.verify()
        print("STILL HOLDING", flush=True)
    except LeaseLost as e:
        print("LOST", e, flush=True)
"""


def holder(lease_s: float) -> tuple[subprocess.Popen, str]:
    """A process holding the lease on "toy", and its ticket."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lease_s)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    line = proc.stdout.readline()
    assert line.startswith("HOLDING "), line + proc.stderr.read()
    return proc, line.split()[1]


@contextlib.contextmanager
def lease_taken(c, ws, lease_s: float, timeout: float = 120) -> Iterator[lease.Lease]:
    """The lease on "toy", taken in a thread (a hung wait fails the test instead of
    hanging the suite) and held until the block ends."""
    held: list = []
    got, release = threading.Event(), threading.Event()

    def take() -> None:
        with lease.model_lease(c, ws, "toy", lease_s) as mine:
            held.append(mine)
            got.set()
            release.wait(timeout)

    taker = threading.Thread(target=take, daemon=True)
    taker.start()
    assert got.wait(timeout), "the lease was never handed over"
    try:
        yield held[0]
    finally:
        release.set()
        taker.join(60)


def ticket_state(c, ticket: str) -> str | None:
    from mlflow.exceptions import MlflowException

    try:
        return c.get_model_version("toy" + lease.QUEUE_SUFFIX, ticket).tags[lease.STATE]
    except MlflowException:
        return None  # cleared from the queue


def test_one_holder_at_a_time_and_a_live_holder_keeps_its_lease_past_lease_s(trainflow_home):
    ws = workspace()
    c = store.client(ws)
    inside: list[str] = []
    overlap = threading.Event()

    def hold(i: int) -> None:
        with lease.model_lease(c, ws, "toy", lease_s=0.8):
            if inside:
                overlap.set()
            inside.append(str(i))
            threading.Event().wait(2.0)  # longer than lease_s: only the beat keeps it
            inside.remove(str(i))

    threads = [threading.Thread(target=hold, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert not overlap.is_set(), "two holders at once"
    queue = c.get_registered_model("toy" + lease.QUEUE_SUFFIX)
    assert lease.is_queue(queue.tags)
    tickets = c.search_model_versions("name='toy.trainflow-gate'")
    assert {t.tags[lease.STATE] for t in tickets} == {lease.RELEASED}
    assert len(tickets) == 1, "done tickets below a holder's are cleared"


def test_a_crashed_holders_lease_is_taken_over_after_lease_s(trainflow_home, caplog):
    ws = workspace()
    c = store.client(ws)
    proc, crashed = holder(lease_s=1.0)
    proc.kill()
    proc.wait()
    with caplog.at_level(logging.WARNING, logger="trainflow"), lease_taken(c, ws, lease_s=1.0) as mine:
        assert int(mine.ticket) > int(crashed)
        assert ticket_state(c, crashed) == lease.EXPIRED
    assert f"pid {proc.pid}) has not been renewed for 1 s: taken as crashed" in caplog.text


def test_a_holder_stalled_past_its_lease_learns_it_lost_it_before_it_moves_an_alias(trainflow_home):
    ws = workspace()
    c = store.client(ws)
    proc, stalled = holder(lease_s=1.0)
    os.kill(proc.pid, signal.SIGSTOP)  # a holder that stops beating without dying
    try:
        with lease_taken(c, ws, lease_s=1.0) as mine:
            mine.verify()  # the new holder holds
            os.kill(proc.pid, signal.SIGCONT)
            out, err = proc.communicate("\n", timeout=60)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
    assert proc.returncode == 0, err
    assert (
        "LOST the gate's lease on toy was lost: this run stalled for longer than registry.lease_s (1 s)"
        in out
    )
    assert ticket_state(c, stalled) in (lease.EXPIRED, lease.RELEASED, None)


def test_promote_waits_for_the_lease_and_the_queue_is_no_model_of_the_users(trainflow_home, tmp_path):
    from tests.pipelines.test_registry import make_checkpoint, register

    ws = workspace()
    register(ws, make_checkpoint(tmp_path / "c1"), 0.8)
    register(ws, make_checkpoint(tmp_path / "c2"), 0.7)
    c = store.client(ws)
    done = threading.Event()
    with lease_taken(c, ws, lease_s=30):
        threading.Thread(target=lambda: (versions.promote(ws, "toy", "2"), done.set()), daemon=True).start()
        assert not done.wait(1.5), "promote moved the champion while another process held the lease"
        assert str(c.get_model_version_by_alias("toy", "champion").version) == "1"
    assert done.wait(60)
    assert str(c.get_model_version_by_alias("toy", "champion").version) == "2"
    with pytest.raises(versions.RegistryError, match="unknown model 'nope'; registered models: toy$"):
        versions.rollback(ws, "nope")
