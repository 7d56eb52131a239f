"""The gate's lease, kept in the registry itself: one process at a time, on any machine,
reads a model's champion and moves its aliases, with only the MLflow registry shared.

MLflow has no compare-and-set, but numbers a model's versions itself, each once. So each
model has a queue beside it, the registered model ``<name>.trainflow-gate``: a process
registers a version of it (its ticket) and holds the lease once every lower ticket is done.
A ticket beats (a tag counted up every quarter of ``lease_s``) while its process waits or
holds; a waiter that sees a beat unchanged for ``lease_s`` of its own clock marks that
ticket expired, whatever the machines' clocks say. Before moving an alias the holder checks
that its ticket still holds (:meth:`Lease.verify`), so a stalled process decides again."""

from __future__ import annotations

import contextlib
import getpass
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlflow import MlflowClient

    from trainflow.workspace import Workspace

log = logging.getLogger("trainflow")

QUEUE_SUFFIX = ".trainflow-gate"
QUEUE_OF_TAG = "trainflow.gate_queue_of"  # on the queue: the model it queues for
QUEUE_RUN_TAG = "trainflow.gate_queue_run"  # on the queue: the MLflow run of its tickets
# A ticket's tags: its state, its beat and who holds it (user@host pid N).
STATE = "trainflow.ticket.state"
BEAT = "trainflow.ticket.beat"
HOLDER = "trainflow.ticket.holder"
# Its states: in the queue (waiting for its turn, or holding the lease once every lower
# ticket is done), and the two that are done.
QUEUED = "queued"
RELEASED = "released"
EXPIRED = "expired"
DONE = (RELEASED, EXPIRED)
LEASE_S = 60.0  # the default: registry.lease_s
POLL_S = 0.25  # how often a waiting ticket looks at the queue


class LeaseLost(RuntimeError):
    """The ticket no longer holds the model's lease: its process stalled past ``lease_s``
    and a waiter took it for crashed."""


def queue_name(name: str) -> str:
    return f"{name}{QUEUE_SUFFIX}"


def is_queue(tags: dict[str, str]) -> bool:
    """Whether a registered model's tags say it is a gate's queue, not a model."""
    return QUEUE_OF_TAG in tags


@dataclass
class Lease:
    """A held lease on a model's gate: its ticket in the model's queue."""

    c: MlflowClient
    queue: str
    ticket: str
    lease_s: float
    _stop: threading.Event = field(default_factory=threading.Event)

    def verify(self) -> None:
        """The fencing check: LeaseLost unless this ticket still holds the lease."""
        from mlflow.exceptions import MlflowException

        try:
            state = self.c.get_model_version(self.queue, self.ticket).tags.get(STATE)
        except MlflowException:
            state = None  # removed from the queue as done
        if state != QUEUED:
            raise LeaseLost(
                f"the gate's lease on {self.queue.removesuffix(QUEUE_SUFFIX)} was lost: this run "
                f"stalled for longer than registry.lease_s ({self.lease_s:g} s)"
            )

    def _beat(self) -> None:
        """Count the ticket's beat up every quarter of lease_s until the lease ends."""
        beat = 0
        while not self._stop.wait(self.lease_s / 4):
            beat += 1
            try:
                self.c.set_model_version_tag(self.queue, self.ticket, BEAT, str(beat))
            except Exception as e:  # a registry that does not answer for a moment: beat again
                log.debug("the gate's ticket %s/%s missed a beat: %s", self.queue, self.ticket, e)


def _ensure_queue(c: MlflowClient, ws: Workspace, name: str) -> tuple[str, str]:
    """The model's queue, made on first use; with the id of the MLflow run its tickets
    name as their source (a server takes a version only from a run's artifacts)."""
    from mlflow.exceptions import MlflowException

    from trainflow.pipelines.registry.store import experiment_id

    queue = queue_name(name)
    try:
        return queue, c.get_registered_model(queue).tags[QUEUE_RUN_TAG]
    except MlflowException as e:
        if e.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
    run = c.create_run(experiment_id(c, ws), run_name=f"{name} gate queue")
    c.set_terminated(run.info.run_id)
    try:
        c.create_registered_model(
            queue,
            tags={QUEUE_OF_TAG: name, QUEUE_RUN_TAG: run.info.run_id},
            description=f"The promotion gate's queue for {name}, kept by trainflow: each version is "
            "a run's turn at moving its aliases.",
        )
        return queue, run.info.run_id
    except MlflowException as e:
        if e.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    c.delete_run(run.info.run_id)  # another process made the queue first
    return queue, c.get_registered_model(queue).tags[QUEUE_RUN_TAG]


def _holder() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()} pid {os.getpid()}"


@contextlib.contextmanager
def model_lease(c: MlflowClient, ws: Workspace, name: str, lease_s: float = LEASE_S) -> Iterator[Lease]:
    """Hold the lease on ``name``'s gate for the block; wait for it first."""
    queue, run_id = _ensure_queue(c, ws, name)
    tags = {STATE: QUEUED, BEAT: "0", HOLDER: _holder()}
    mv = c.create_model_version(queue, f"runs:/{run_id}/ticket", run_id=run_id, tags=tags)
    lease = Lease(c, queue, str(mv.version), lease_s)
    beating = threading.Thread(target=lease._beat, name="trainflow-gate-beat", daemon=True)
    beating.start()
    done_below: list[str] = []
    try:
        done_below = _wait_for_turn(lease)
        yield lease
    finally:
        lease._stop.set()
        with contextlib.suppress(Exception):  # else a waiter takes it for crashed in lease_s
            c.set_model_version_tag(queue, lease.ticket, STATE, RELEASED)
    for version in done_below:  # the queue's done tickets, cleared once the next turn runs
        with contextlib.suppress(Exception):  # another holder may have cleared it first
            c.delete_model_version(queue, version)


def _wait_for_turn(lease: Lease) -> list[str]:
    """Until every lower ticket in the queue is done (released, expired or gone): then
    this ticket holds the lease. Returns the done tickets below it."""
    c = lease.c
    ticket = int(lease.ticket)
    seen: dict[str, tuple[str | None, float]] = {}  # ticket: its beat, when that beat was first seen
    waited_on: str | None = None
    while True:
        tickets = c.search_model_versions(f"name='{lease.queue}'")
        ahead = [t for t in tickets if int(t.version) < ticket and t.tags.get(STATE) not in DONE]
        now = time.monotonic()
        alive = []
        for t in ahead:
            beat = t.tags.get(BEAT)
            if t.version not in seen or seen[t.version][0] != beat:
                seen[t.version] = (beat, now)
            if now - seen[t.version][1] < lease.lease_s:
                alive.append(t)
                continue
            log.warning(
                "the gate's lease of %s (%s) has not been renewed for %g s: taken as crashed",
                lease.queue.removesuffix(QUEUE_SUFFIX),
                t.tags.get(HOLDER, "another run"),
                lease.lease_s,
            )
            c.set_model_version_tag(lease.queue, t.version, STATE, EXPIRED)
        if not alive:
            return [t.version for t in tickets if int(t.version) < ticket and t.tags.get(STATE) in DONE]
        holder = alive[0].tags.get(HOLDER, "another run")
        if holder != waited_on:
            log.info("waiting for the gate of %s: %s has it", lease.queue.removesuffix(QUEUE_SUFFIX), holder)
            waited_on = holder
        time.sleep(POLL_S)
