"""Shadowing a challenger (``trainflow models serve NAME --shadow challenger``): the served
model answers every request, and a second version gets its rows off the answers' path.

The challenger runs in a Serve replica of its own (:class:`ShadowServer`), second in line
for the CPU. Each served replica gathers what it answered and every SEND_EVERY_S hands it
over in one call (:class:`Shadowing`): the answers pay for a list append. A challenger that
falls behind (MAX_SENDING calls unfinished, MAX_GATHERED waiting) misses requests, counted,
and never delays an answer. :class:`ShadowLedger` keeps, per pair of versions, the rows
compared, their agreement (or a regression's differences), each model's p50 and p95 time,
errors, and the score of ``/feedback``'s labels; ``GET /shadow``, the ``shadow-report``
flow and ``trainflow models promote --min-agreement/--feedback-win`` read it."""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from collections import OrderedDict, deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from ray import serve

from trainflow.files import replacing_file

if TYPE_CHECKING:
    from trainflow.pipelines.serving.requests import Inputs
    from trainflow.pipelines.serving.served import Served
    from trainflow.workspace import Workspace

log = logging.getLogger("trainflow.serving")

SEND_EVERY_S = 0.05  # how often a served replica hands its answered requests to the challenger
MAX_GATHERED = 1024  # requests a served replica holds for the next call
MAX_SENDING = 4  # a served replica's calls to the challenger not done yet
MAX_ONGOING = 16  # calls the challenger's replica takes at once, from all the served replicas
LATENCIES = 2000  # the latest model times kept per model and pair
REMEMBERED = 10000  # the latest answers that feedback may name
SAVE_EVERY_S = 2.0
NICENESS = 10  # the challenger's replica process: behind the served ones for the CPU


def shadow_file(ws: Workspace, model: str) -> Path:
    return ws.home / "serving" / model / "shadow.json"


def _percentiles(values) -> dict[str, float] | None:
    if not values:
        return None
    p50, p95 = np.percentile(np.asarray(values) * 1000.0, [50, 95])
    return {"p50": round(float(p50), 3), "p95": round(float(p95), 3), "requests": len(values)}


class _Pair:
    """What the answers of one champion version and one challenger version show."""

    def __init__(self, champion: str, challenger: str, objective: str):
        self.champion = champion
        self.challenger = challenger
        self.objective = objective
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
        if self.objective == "regression":
            diff = np.abs(champion.astype(float) - challenger.astype(float))
            self.abs_diff_sum += float(diff.sum())
            self.abs_diff_max = max(self.abs_diff_max, float(diff.max(initial=0.0)))
        else:
            self.agreeing += int((champion == challenger).sum())

    def score(self, champion: np.ndarray, challenger: np.ndarray, labels: np.ndarray) -> None:
        self.labelled += len(labels)
        for who, predicted in (("champion", champion), ("challenger", challenger)):
            if self.objective == "regression":
                self.scores[who] += float(np.abs(predicted.astype(float) - labels.astype(float)).sum())
            else:
                self.scores[who] += float((predicted == labels).sum())

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "champion": self.champion,
            "challenger": self.challenger,
            "objective": self.objective,
            "task": self.objective,  # its old name, still answered in this release
            "requests": self.requests,
            "rows": self.rows,
            "errors": self.errors,
            "not_shadowed": self.not_shadowed,
            "latency_ms": {who: _percentiles(times) for who, times in self.times.items()},
        }
        if self.objective == "regression":
            out["mean_abs_difference"] = self.abs_diff_sum / self.rows if self.rows else None
            out["max_abs_difference"] = self.abs_diff_max if self.rows else None
        else:
            out["agreement"] = self.agreeing / self.rows if self.rows else None
        out["feedback"] = self._feedback()
        return out

    def _feedback(self) -> dict[str, Any]:
        n = self.labelled
        metric = "mae" if self.objective == "regression" else "accuracy"
        scored = {who: (self.scores[who] / n if n else None) for who in ("champion", "challenger")}
        won = None
        if n:
            better = scored["challenger"] < scored["champion"] if metric == "mae" else None
            won = better if better is not None else scored["challenger"] > scored["champion"]
        return {"rows": n, "metric": metric, **scored, "challenger_wins": won}


class ShadowLedger:
    """The comparison of a model's answers with its challenger's, for every served
    replica, saved to ``path`` every SAVE_EVERY_S seconds when it changed, by a thread of
    its own. A server's ledger starts anew."""

    def __init__(self, model: str, path: str):
        self.model = model
        self.path = Path(path)
        self.pairs: dict[tuple[str, str], _Pair] = {}
        self.answers: OrderedDict[str, tuple[tuple[str, str], np.ndarray, np.ndarray]] = OrderedDict()
        self._changed = False
        self._lock = threading.RLock()
        threading.Thread(target=self._save_every, name="trainflow-shadow-save", daemon=True).start()

    def _pair(self, champion: str, challenger: str, objective: str) -> _Pair:
        key = (champion, challenger)
        if key not in self.pairs:
            self.pairs[key] = _Pair(champion, challenger, objective)
        return self.pairs[key]

    def record(
        self,
        versions: tuple[str, str],
        objective: str,
        answers: list[tuple[str, list, list]],
        times: tuple[list[float], float],
    ) -> None:
        """Requests both models answered: per request its answer's id, the champion's and
        the challenger's predictions; the champion's time per request, for each, and the
        challenger's, for all."""
        with self._lock:
            self._record(versions, objective, answers, times)

    def _record(self, versions, objective, answers, times) -> None:
        pair = self._pair(*versions, objective)
        for id_, champion, challenger in answers:
            a = np.asarray(champion)
            b = np.asarray(challenger)
            pair.add(a, b, 1)
            self.answers[id_] = (versions, a, b)
        while len(self.answers) > REMEMBERED:
            self.answers.popitem(last=False)
        pair.times["champion"].extend(times[0])
        pair.times["challenger"].extend([times[1]] * len(answers))
        self._changed = True

    def missed(
        self, versions: tuple[str, str], objective: str, *, errors: int = 0, not_shadowed: int = 0
    ) -> None:
        """Requests the challenger failed on, or that were not shadowed (it was behind)."""
        with self._lock:
            pair = self._pair(*versions, objective)
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
        if pair.objective == "regression":
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
            self._changed = False
            text = json.dumps(self.summary(), indent=2)
        try:
            with replacing_file(self.path) as tmp:
                tmp.write_text(text)
        except OSError as e:  # a full disk: the comparison is an aid, serving goes on
            log.warning("cannot save the shadow comparison to %s: %s", self.path, e)


@serve.deployment(max_ongoing_requests=MAX_ONGOING)
class ShadowServer:
    """The challenger's one replica: answers the requests the served replicas hand it, in
    a process second in line for the CPU (niceness NICENESS), and keeps the comparison
    (:class:`ShadowLedger`) for all of them."""

    def __init__(self, uri: str, home: str, tracking_uri: str | None, poll_interval_s: float):
        from trainflow.pipelines.registry import versions
        from trainflow.pipelines.serving.served import Served, use_registry
        from trainflow.workspace import Workspace

        os.nice(NICENESS)  # the answers' replicas first: a shadow takes the CPU they leave
        use_registry(tracking_uri)
        self._ws = Workspace(Path(home))
        self.uri = uri
        mv = versions.resolve(self._ws, uri)
        self.served = Served.load(self._ws, mv.name, str(mv.version))
        self.ledger = ShadowLedger(mv.name, str(shadow_file(self._ws, mv.name)))
        if versions.followed_alias(uri):
            threading.Thread(
                target=self._follow, args=(poll_interval_s,), name="trainflow-follow", daemon=True
            ).start()

    def _follow(self, poll_interval_s: float) -> None:
        """Every poll interval, the version the shadowed alias points at; a failure keeps
        the current one shadowing."""
        from trainflow.pipelines.registry import versions
        from trainflow.pipelines.serving.served import Served

        while True:
            time.sleep(poll_interval_s)
            try:
                mv = versions.resolve(self._ws, self.uri)
                if str(mv.version) != self.served.version:
                    old = self.served.version
                    self.served = Served.load(self._ws, mv.name, str(mv.version))
                    log.warning("%s: now shadowing version %s (was %s)", self.uri, mv.version, old)
            except Exception as e:  # the registry unreachable, a checkpoint refused: keep shadowing
                log.warning("%s: cannot follow the alias: %s: %s", self.uri, type(e).__name__, e)

    def compare(self, gathered: list[tuple], not_shadowed: int, latest: tuple[str, str]) -> None:
        """Answer, in one pass per champion version, the requests a served replica
        answered: each ``(champion version, objective, inputs, (answer id, predictions),
        champion's seconds)``;
        record the two answers. ``not_shadowed``: the requests it could not hand over
        since its last call, counted against ``latest`` (its champion version and objective)."""
        by_version: dict[tuple[str, str], list[tuple]] = {}
        for one in gathered:
            by_version.setdefault((one[0], one[1]), []).append(one)
        for (champion, objective), group in by_version.items():
            self._compare(champion, objective, group)
        if not_shadowed:
            self.ledger.missed((latest[0], self.served.version), latest[1], not_shadowed=not_shadowed)

    def _compare(self, champion: str, objective: str, group: list[tuple]) -> None:
        from trainflow.pipelines.serving.requests import RequestError
        from trainflow.pipelines.serving.served import answer

        challenger = self.served
        versions = (champion, challenger.version)
        start = time.perf_counter()
        try:
            theirs = answer(challenger, [inputs for _, _, inputs, _, _ in group])
        except Exception as e:  # the challenger's fault must not stop the shadowing
            log.warning("%s: the challenger failed: %s: %s", self.uri, type(e).__name__, e)
            theirs = [RequestError(500, "body", str(e))] * len(group)
        took = (time.perf_counter() - start) / len(group)
        compared = [(one, other) for one, other in zip(group, theirs, strict=True) if isinstance(other, dict)]
        if compared:
            pairs = [(*one[3], other["predictions"]) for one, other in compared]
            self.ledger.record(versions, objective, pairs, ([one[4] for one, _ in compared], took))
        if len(compared) < len(group):
            self.ledger.missed(versions, objective, errors=len(group) - len(compared))

    def summary(self) -> dict[str, Any]:
        return self.ledger.summary()

    def feedback(self, answer_id: str, labels: list) -> dict[str, Any] | str:
        return self.ledger.feedback(answer_id, labels)


class Shadowing:
    """A served replica's side of the shadow: the requests it answered, gathered and handed
    to the challenger's replica (``handle``) every SEND_EVERY_S seconds in one call, by a
    thread of its own; the answers never wait. While MAX_SENDING calls are unfinished, it
    goes on gathering; requests beyond MAX_GATHERED are counted as not shadowed."""

    def __init__(self, uri: str, handle):
        self.uri = uri
        self.handle = handle
        self._lock = threading.Lock()
        self._gathered: list[tuple] = []
        self._missed = 0
        self._latest = ("", "")
        self._slots = threading.Semaphore(MAX_SENDING)
        self._sent: queue.Queue = queue.Queue()
        threading.Thread(target=self._send_every, name="trainflow-shadow-send", daemon=True).start()
        threading.Thread(target=self._settle, name="trainflow-shadow-settle", daemon=True).start()

    def offer(self, champion: Served, batch: list[Inputs], answers: list, seconds: float) -> None:
        """Gather a batch that ``champion`` answered in ``seconds``: its answered requests,
        each with its answer's id and predictions (what the comparison reads of it) and its
        share of the time."""
        objective = champion.predictor.preprocessor.objective
        each = seconds / len(batch)
        answered = [
            (champion.version, objective, inputs, (one["id"], one["predictions"]), each)
            for inputs, one in zip(batch, answers, strict=True)
            if isinstance(one, dict)
        ]
        with self._lock:
            self._latest = (champion.version, objective)
            if len(self._gathered) + len(answered) > MAX_GATHERED:
                self._missed += len(answered)
            else:
                self._gathered += answered

    def _send_every(self) -> None:
        while True:
            time.sleep(SEND_EVERY_S)
            with self._lock:
                if not self._gathered and not self._missed:
                    continue
                if not self._slots.acquire(blocking=False):  # the challenger is behind: keep gathering
                    continue
                gathered = self._gathered
                missed = self._missed
                self._gathered = []
                self._missed = 0
                latest = self._latest
            self._sent.put(self.handle.compare.remote(gathered, missed, latest))

    def _settle(self) -> None:
        """Frees a slot as each call is done."""
        while True:
            sent = self._sent.get()
            try:
                sent.result()
            except Exception as e:  # a lost shadow replica: Serve starts another
                log.warning("%s: requests were not shadowed: %s: %s", self.uri, type(e).__name__, e)
            finally:
                self._slots.release()


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
    from trainflow.pipelines.registry.versions import RegistryError

    pairs = [
        p for p in read_shadow(ws, model)["pairs"] if (p["champion"], p["challenger"]) == (champion, version)
    ]
    if not pairs or not pairs[0]["rows"]:
        raise RegistryError(
            f"{model} version {version} was not shadowed beside champion version {champion}: serve "
            f"{model} with --shadow {version} (or the alias on it) and send it requests first"
        )
    pair = pairs[0]
    found = []
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
        if p.get("objective", p.get("task")) == "regression":  # task: a replica of an older release
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

    answer_id = payload.get("id")
    labels = payload.get("labels")
    if not isinstance(answer_id, str):
        raise RequestError(422, "id", "the id of a shadowed answer, as POST /predict gave it, is required")
    if not isinstance(labels, list) or not labels:
        raise RequestError(422, "labels", "a list of labels, one per row of that answer, is required")
    return answer_id, labels


def shadow_uri(name: str, shadow: str) -> str:
    """The model URI of ``--shadow``: an alias (``challenger``) or a version (``3``) of ``name``."""
    return f"{name}/{shadow}" if shadow.isdigit() else f"{name}@{shadow}"
