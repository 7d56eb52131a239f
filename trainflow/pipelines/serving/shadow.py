"""Shadowing a challenger: every request is answered by the served model, and its rows
are also given, off the answer's path, to a second version of the same model
(``trainflow models serve NAME --shadow challenger``).

Each replica hands the batches it answered to a thread of its own (:class:`Shadow`),
through a queue of at most MAX_QUEUED batches: when the challenger falls behind, later
batches are not shadowed (and counted), so the answers never wait for it. What the two
answers and their model times show is kept by one :class:`ShadowLedger` for all the
replicas, a Ray actor named after the model, which saves it under
``TRAINFLOW_HOME/serving/<name>/shadow.json``: ``GET /shadow`` shows it, the
``shadow-report`` flow publishes it, and ``trainflow models promote --min-agreement`` or
``--feedback-win`` requires it. Labelled feedback posted to ``/feedback`` (the answer's
``id`` and a label per row) scores both models' answers.

Per pair of versions (the champion's, the challenger's): the requests and rows compared,
the share of rows whose classes agree (a classifier) or the mean and largest absolute
difference (a regression), each model's time per batch (the latest LATENCIES, as p50 and
p95), the challenger's errors, the batches not shadowed, and the feedback's score.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections import OrderedDict, deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trainflow.files import replacing_file

if TYPE_CHECKING:
    from trainflow.pipelines.serving.requests import Inputs
    from trainflow.pipelines.serving.served import Served
    from trainflow.workspace import Workspace

log = logging.getLogger("trainflow.serving")

MAX_QUEUED = 64  # batches waiting for the challenger on one replica
LATENCIES = 2000  # the latest model times kept per model and pair
REMEMBERED = 10000  # the latest answers that feedback may name
SAVE_EVERY_S = 2.0
NAMESPACE = "trainflow"  # the Ray namespace of the ledgers


def ledger_name(model: str) -> str:
    return f"trainflow-shadow-{model}"


def shadow_file(ws: Workspace, model: str) -> Path:
    return ws.home / "serving" / model / "shadow.json"


def _percentiles(values) -> dict[str, float] | None:
    if not values:
        return None
    p50, p95 = np.percentile(np.asarray(values) * 1000.0, [50, 95])
    return {"p50": round(float(p50), 3), "p95": round(float(p95), 3), "batches": len(values)}


class _Pair:
    """What the answers of one champion version and one challenger version show."""

    def __init__(self, champion: str, challenger: str, task: str):
        self.champion, self.challenger, self.task = champion, challenger, task
        self.requests = self.rows = self.agreeing = self.errors = self.not_shadowed = 0
        self.abs_diff_sum = self.abs_diff_max = 0.0
        self.times: dict[str, deque] = {
            "champion": deque(maxlen=LATENCIES),
            "challenger": deque(maxlen=LATENCIES),
        }
        self.labelled = 0
        self.scores = {"champion": 0.0, "challenger": 0.0}  # rows right, or absolute errors summed

    def add(self, champion: np.ndarray, challenger: np.ndarray, requests: int) -> None:
        self.requests += requests
        self.rows += len(champion)
        if self.task == "regression":
            diff = np.abs(champion.astype(float) - challenger.astype(float))
            self.abs_diff_sum += float(diff.sum())
            self.abs_diff_max = max(self.abs_diff_max, float(diff.max(initial=0.0)))
        else:
            self.agreeing += int((champion == challenger).sum())

    def score(self, champion: np.ndarray, challenger: np.ndarray, labels: np.ndarray) -> None:
        self.labelled += len(labels)
        for who, predicted in (("champion", champion), ("challenger", challenger)):
            if self.task == "regression":
                self.scores[who] += float(np.abs(predicted.astype(float) - labels.astype(float)).sum())
            else:
                self.scores[who] += float((predicted == labels).sum())

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "champion": self.champion,
            "challenger": self.challenger,
            "task": self.task,
            "requests": self.requests,
            "rows": self.rows,
            "errors": self.errors,
            "not_shadowed": self.not_shadowed,
            "latency_ms": {who: _percentiles(times) for who, times in self.times.items()},
        }
        if self.task == "regression":
            out["mean_abs_difference"] = self.abs_diff_sum / self.rows if self.rows else None
            out["max_abs_difference"] = self.abs_diff_max if self.rows else None
        else:
            out["agreement"] = self.agreeing / self.rows if self.rows else None
        out["feedback"] = self._feedback()
        return out

    def _feedback(self) -> dict[str, Any]:
        n = self.labelled
        metric = "mae" if self.task == "regression" else "accuracy"
        scored = {who: (self.scores[who] / n if n else None) for who in ("champion", "challenger")}
        won = None
        if n:
            better = scored["challenger"] < scored["champion"] if metric == "mae" else None
            won = better if better is not None else scored["challenger"] > scored["champion"]
        return {"rows": n, "metric": metric, **scored, "challenger_wins": won}


class ShadowLedger:
    """The comparison of a model's answers with its challenger's, for every replica: a
    Ray actor (:func:`ledger`), saved to ``path`` every SAVE_EVERY_S seconds when it
    changed, by a thread of its own. A server's ledger starts anew."""

    def __init__(self, model: str, path: str):
        self.model, self.path = model, Path(path)
        self.pairs: dict[tuple[str, str], _Pair] = {}
        self.answers: OrderedDict[str, tuple[tuple[str, str], np.ndarray, np.ndarray]] = OrderedDict()
        self._changed = False
        self._lock = threading.RLock()
        threading.Thread(target=self._save_every, name="trainflow-shadow-save", daemon=True).start()

    def _pair(self, champion: str, challenger: str, task: str) -> _Pair:
        key = (champion, challenger)
        if key not in self.pairs:
            self.pairs[key] = _Pair(champion, challenger, task)
        return self.pairs[key]

    def record(self, versions: tuple[str, str], task: str, answers: list[tuple[str, list, list]],
               times: tuple[float, float]) -> None:  # fmt: skip
        """One batch: per request its answer's id, the champion's and the challenger's
        predictions; each model's time for the batch."""
        with self._lock:
            self._record(versions, task, answers, times)

    def _record(self, versions, task, answers, times) -> None:
        pair = self._pair(*versions, task)
        for id_, champion, challenger in answers:
            a, b = np.asarray(champion), np.asarray(challenger)
            pair.add(a, b, 1)
            self.answers[id_] = (versions, a, b)
        while len(self.answers) > REMEMBERED:
            self.answers.popitem(last=False)
        pair.times["champion"].append(times[0])
        pair.times["challenger"].append(times[1])
        self._changed = True

    def missed(self, versions: tuple[str, str], task: str, *, errors: int = 0, not_shadowed: int = 0) -> None:
        """Batches the challenger failed on, or that were not shadowed (it was behind)."""
        with self._lock:
            pair = self._pair(*versions, task)
            pair.errors += errors
            pair.not_shadowed += not_shadowed
            self._changed = True

    def feedback(self, answer_id: str, labels: list) -> dict[str, Any] | str:
        """Score an answer's two predictions against its rows' labels: the pair's summary,
        or what is wrong with the feedback, in words."""
        with self._lock:
            return self._feedback(answer_id, labels)

    def _feedback(self, answer_id: str, labels: list) -> dict[str, Any] | str:
        if answer_id not in self.answers:
            return (
                f"id: no shadowed answer {answer_id!r}; give the id of one of the latest {REMEMBERED} answers"
            )
        versions, champion, challenger = self.answers[answer_id]
        if len(labels) != len(champion):
            return f"labels: {len(labels)} labels for an answer of {len(champion)} rows; give one per row"
        pair = self.pairs[versions]
        if pair.task == "regression":
            try:
                truth = np.asarray(labels, dtype=float)
            except (TypeError, ValueError):
                return f"labels: a regression's labels are numbers, not {labels!r}"
            pair.score(champion, challenger, truth)
        else:  # classes compared as values: 3 is the class 3, "3" is not
            pair.score(champion.astype(object), challenger.astype(object), np.asarray(labels, dtype=object))
        self._changed = True
        return pair.summary()

    def summary(self) -> dict[str, Any]:
        """Every pair of versions compared, the latest first."""
        with self._lock:
            return {"model": self.model, "pairs": [p.summary() for p in reversed(self.pairs.values())]}

    def _save_every(self) -> None:
        while True:
            time.sleep(SAVE_EVERY_S)
            self.save()

    def save(self) -> None:
        """Write the comparison to ``path`` (a rename) when it changed since last written."""
        with self._lock:
            if not self._changed:
                return
            self._changed, text = False, json.dumps(self.summary(), indent=2)
        try:
            with replacing_file(self.path) as tmp:
                tmp.write_text(text)
        except OSError as e:  # a full disk: the comparison is an aid, serving goes on
            log.warning("cannot save the shadow comparison to %s: %s", self.path, e)


def ledger(ws: Workspace, model: str):
    """The model's ledger actor, started by the first replica that asks for it: detached,
    so it outlives the replica that started it (``stop_ledger`` ends it with the server)."""
    import ray

    actor = ray.remote(num_cpus=0, max_concurrency=1)(ShadowLedger)
    return actor.options(
        name=ledger_name(model), namespace=NAMESPACE, get_if_exists=True, lifetime="detached"
    ).remote(model, str(shadow_file(ws, model)))


def stop_ledger(model: str) -> None:
    """Save and end the model's ledger, if one runs."""
    import ray

    try:
        actor = ray.get_actor(ledger_name(model), namespace=NAMESPACE)
    except ValueError:
        return
    ray.get(actor.save.remote())
    ray.kill(actor)


class Shadow:
    """A replica's challenger: the batches it answered, answered again by ``uri``'s
    version on a thread of its own, and the two answers handed to the ledger."""

    def __init__(self, uri: str, served: Served, ledger_handle):
        self.uri, self.served, self.ledger = uri, served, ledger_handle
        self._queue: queue.Queue = queue.Queue(maxsize=MAX_QUEUED)
        threading.Thread(target=self._run, name="trainflow-shadow", daemon=True).start()

    def follow(self, ws: Workspace) -> None:
        """Load the version the shadowed alias points at now, when it moved."""
        from trainflow.pipelines import registry
        from trainflow.pipelines.serving.served import Served

        mv = registry.resolve(ws, self.uri)
        if str(mv.version) != self.served.version:
            old, self.served = self.served.version, Served.load(ws, mv.name, str(mv.version))
            log.warning("%s: now shadowing version %s (was %s)", self.uri, mv.version, old)

    def offer(self, champion: Served, batch: list[Inputs], answers: list[dict], seconds: float) -> None:
        """Hand over a batch the champion answered in ``seconds``; never waits."""
        try:
            self._queue.put_nowait((champion, batch, answers, seconds))
        except queue.Full:
            versions = (champion.version, self.served.version)
            self.ledger.missed.remote(versions, champion.predictor.preprocessor.task, not_shadowed=1)

    def _run(self) -> None:
        from trainflow.pipelines.serving.requests import RequestError
        from trainflow.pipelines.serving.served import answer

        while True:
            champion, batch, answers, seconds = self._queue.get()
            challenger = self.served
            versions, task = (champion.version, challenger.version), champion.predictor.preprocessor.task
            start = time.perf_counter()
            try:
                theirs = answer(challenger, batch)
            except Exception as e:  # the challenger's fault must not stop the shadowing
                log.warning("%s: the challenger failed on a batch: %s: %s", self.uri, type(e).__name__, e)
                theirs = [RequestError(500, "body", str(e))] * len(batch)
            took = time.perf_counter() - start
            pairs = [
                (mine["id"], mine["predictions"], other["predictions"])
                for mine, other in zip(answers, theirs, strict=True)
                if isinstance(mine, dict) and isinstance(other, dict)
            ]
            failed = sum(isinstance(other, RequestError) for other in theirs)
            if pairs:
                self.ledger.record.remote(versions, task, pairs, (seconds, took))
            if failed:
                self.ledger.missed.remote(versions, task, errors=failed)


def read_shadow(ws: Workspace, model: str) -> dict[str, Any]:
    """The model's saved comparison; DataError, naming the file, when there is none."""
    from trainflow.pipelines.data.schema import DataError

    path = shadow_file(ws, model)
    if not path.is_file():
        raise DataError(
            f"no shadow comparison of {model} at {path}: serve it with a shadow "
            f"(trainflow models serve {model} --shadow challenger) and send it requests first"
        )
    return json.loads(path.read_text())


def require_shadow(
    ws: Workspace, model: str, champion: str, version: str, *, min_agreement: float | None, feedback_win: bool
) -> str:
    """What the shadow comparison of ``version`` beside ``champion`` says, in words, when
    it meets what a promotion asks: agreement of at least ``min_agreement`` (a
    classifier's classes), a win on labelled feedback; RegistryError, saying what it
    found, when it does not."""
    from trainflow.pipelines.registry import RegistryError

    pairs = [
        p for p in read_shadow(ws, model)["pairs"] if (p["champion"], p["challenger"]) == (champion, version)
    ]
    if not pairs or not pairs[0]["rows"]:
        raise RegistryError(
            f"{model} version {version} was not shadowed beside champion version {champion}: serve "
            f"{model} with --shadow {version} (or the alias on it) and send it requests first"
        )
    pair, found = pairs[0], []
    if min_agreement is not None:
        agreement = pair.get("agreement")
        if agreement is None:
            raise RegistryError(f"--min-agreement: {model} is a regression; its answers agree by no class")
        if agreement < min_agreement:
            raise RegistryError(
                f"version {version} agreed with champion {champion} on {agreement:.1%} of "
                f"{pair['rows']} rows, below --min-agreement {min_agreement:g}"
            )
        found.append(f"agreed on {agreement:.1%} of {pair['rows']} rows")
    if feedback_win:
        fb = pair["feedback"]
        if not fb["challenger_wins"]:
            scores = (
                f"{fb['metric']} {fb['challenger']:.4f} vs {fb['champion']:.4f}"
                if fb["rows"]
                else "no labels"
            )
            raise RegistryError(
                f"--feedback-win: version {version} did not beat champion {champion} on labelled "
                f"feedback ({scores}, {fb['rows']} rows)"
            )
        found.append(
            f"won on {fb['rows']} labelled rows "
            f"({fb['metric']} {fb['challenger']:.4f} vs {fb['champion']:.4f})"
        )
    return "shadowed beside champion " + champion + ": " + ", ".join(found)


def summary_markdown(summary: dict[str, Any]) -> str:
    """The comparison as a Markdown table, a row per pair of versions."""
    lines = [
        f"# {summary['model']}: shadow comparison",
        "",
        "| champion | challenger | requests | rows | agreement / mean abs. difference | "
        "p50 ms (champion, challenger) | errors | not shadowed | feedback |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in summary["pairs"]:
        if p["task"] == "regression":
            compared = "—" if p["mean_abs_difference"] is None else f"{p['mean_abs_difference']:.4g}"
        else:
            compared = "—" if p["agreement"] is None else f"{p['agreement']:.1%}"
        lat = p["latency_ms"]
        times = ", ".join(
            "—" if lat[w] is None else f"{lat[w]['p50']:.2f}" for w in ("champion", "challenger")
        )
        fb = p["feedback"]
        feedback = "—"
        if fb["rows"]:
            verdict = "challenger wins" if fb["challenger_wins"] else "champion holds"
            scores = f"{fb['metric']} {fb['champion']:.4f} vs {fb['challenger']:.4f}"
            feedback = f"{scores} on {fb['rows']} rows: {verdict}"
        lines.append(
            f"| {p['champion']} | {p['challenger']} | {p['requests']} | {p['rows']} | {compared} | {times} | "
            f"{p['errors']} | {p['not_shadowed']} | {feedback} |"
        )
    return "\n".join(lines) + "\n"


def parse_feedback(payload: dict[str, Any]) -> tuple[str, list]:
    """``POST /feedback``'s answer id and labels; RequestError naming the field."""
    from trainflow.pipelines.serving.requests import RequestError

    answer_id, labels = payload.get("id"), payload.get("labels")
    if not isinstance(answer_id, str):
        raise RequestError(422, "id", "the id of a shadowed answer, as POST /predict gave it, is required")
    if not isinstance(labels, list) or not labels:
        raise RequestError(422, "labels", "a list of labels, one per row of that answer, is required")
    return answer_id, labels


def shadow_uri(name: str, shadow: str) -> str:
    """The model URI of ``--shadow``: an alias (``challenger``) or a version (``3``) of ``name``."""
    return f"{name}/{shadow}" if shadow.isdigit() else f"{name}@{shadow}"
