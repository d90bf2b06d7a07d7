"""Embed or tag a whole collection: files read, sent several to a KServe request, answers
written as Parquet parts (``serveclient.vectors``), with retries and progress.

    walk = Walk()
    job = Job(client, "resnet50-embedding", "embedding", PartSink(output, walk=walk),
              Plan.from_describe(entry))
    summary = job.run(walk.of(collection.entries(shard)), done=output.done())

Pacing (``Plan``): the server runs a batch of up to ``batchSize`` requests per worker, and the
handler admits at most ``max_batch_images`` rows per batch (503 beyond). So each request
carries ``max_batch_images // batchSize`` images (at most ``max_images_per_request``) and
``2 x batchSize x workers`` requests are in flight: one full batch running per worker, the next
one queued behind it.

Explanations (``task="explain"``, ``tsctl explain --html``): one image per request (the
``/explanations`` route takes one), and in flight only what one batch's explanation budget
admits per worker (``handler.explain.max_passes_per_batch`` over the passes one image costs,
``Plan.for_explanations``); the server refuses the rest with 503 and ``Retry-After``, retried
as below.

Failures: a file that cannot be read, is no regular file or is larger than a request can carry
(``collection.read_file``: never blocked on, never read whole), or that the server refuses, is
one ``error`` row and the job goes on. A multi-image request refused for one bad image (the
handler answers it as a whole) is resent image by image, so each file gets its own answer.
503 (busy batch, full queue) and 507 (a worker died) are retried after ``Retry-After`` or a
growing pause; connection errors and timeouts likewise until ``max_outage_s``, then the job
stops (what is written stays, a rerun resumes). A refused key, an unknown model or a missing
key file stop it at once.

Sharing the server (``traffic``, default ``bulk``): the requests say they are a collection
job's, so the server serves people first and refuses the job's surplus with 503. The job then
keeps fewer requests on the wire (``Window``: halved on each 503, at least one, grown back by
one per answer up to ``Plan.concurrency``), so its retries do not queue ahead of people.

Cache: each row records whether the server's content cache answered it (``cached``), and the
summary counts the images it did (``cache_hits``).

The output is the walk: a complete run (every entry answered, every folder listed) merges
keeping only the paths its walk found (``Walk``), so a file moved or deleted since loses its
row; an interrupted run merges nothing and drops nothing (its parts wait for the rerun).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import numpy as np
import requests
from tenacity import (
    Retrying,
    retry_if_exception,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
)
from tenacity.wait import wait_base

from serveclient import errors
from serveclient.client import Answers, Client
from serveclient.collection import Entry, read_file
from serveclient.progress import JobProgress
from serveclient.traffic import BULK, Traffic
from serveclient.vectors import EMBEDDING_DIM, DoneIndex, Output, Row, path_hash, stored_path

TAG_FIELDS = ("label", "index", "probability", "head")  # "head": a model with several

FATAL = (errors.KeyFileError, errors.KeyRejected, errors.NotFound, errors.UsageError)
RETRIED_STATUSES = (503, 507)
OUTAGE = (errors.ServerNotRunning, requests.Timeout, requests.ConnectionError)
DESCRIBE_WAIT_S = 120.0  # a job's start waits this long for a busy model (responseTimeout)
MAX_REQUEST_BYTES = 8 << 20  # raw bytes per request: 11 MiB of base64, under the 32 MiB limits


@dataclass(frozen=True)
class ServerDefaults:
    """The shipped model's settings, used only where describe does not say (a KServe URL
    without the management API): the server's own defaults (``handler:`` from
    servecore.config, ``batchSize`` from config/models/*.yaml). The client image ships without
    servecore, so they are written here once; tests/test_collection.py fails when they differ
    from the server's."""

    batch_size: int = 16
    max_images_per_request: int = 8
    max_batch_images: int = 64
    bulk_batch_images: int = 2
    explain_method: str = "gradcam"
    explain_n_steps: int = 32
    explain_max_passes_per_batch: int = 64


SERVER_DEFAULTS = ServerDefaults()
OCCLUSION_PASSES = 49  # servecore.explain.compute's 7x7 windows


@dataclass(frozen=True)
class Answered:
    """One image's answer, the precision that computed it (``X-Precision``) and whether the
    server's cache answered it (None: the server counted hits without naming them)."""

    value: object
    precision: str | None
    cached: bool | None = False


@dataclass(frozen=True)
class Plan:
    """How hard to push: requests in flight and images per request."""

    concurrency: int = 32
    per_request: int = 4
    max_request_bytes: int = MAX_REQUEST_BYTES

    @classmethod
    def from_describe(
        cls,
        entry: dict | None,
        concurrency: int | None = None,
        per_request: int | None = None,
        *,
        bulk: bool = False,
    ) -> Plan:
        """From a customized describe answer (``TorchServeClient.describe(..., customized=True)
        [0]``), or the shipped model's settings when there is none (a KServe URL without the
        management API); explicit values win. A ``bulk`` job's requests carry at most the
        server's ``bulk_batch_images``: while people are about a batch admits that many bulk
        rows, and a larger request would be its batch's only bulk request, or refused."""
        entry = entry or {}
        handler = (entry.get("customizedMetadata") or {}).get("handler") or {}
        batch = int(entry.get("batchSize") or SERVER_DEFAULTS.batch_size)
        workers = max(1, len(entry.get("workers") or [None]))
        rows = int(handler.get("max_batch_images") or SERVER_DEFAULTS.max_batch_images)
        most = int(handler.get("max_images_per_request") or SERVER_DEFAULTS.max_images_per_request)
        per = per_request or max(1, min(most, rows // batch))
        share = handler.get("bulk_batch_images", SERVER_DEFAULTS.bulk_batch_images)
        if bulk and not per_request and share:
            per = min(per, int(share))
        return cls(concurrency or 2 * batch * workers, per)

    @classmethod
    def for_explanations(
        cls,
        entry: dict | None,
        method: str | None,
        n_steps: int | None,
        targets: int,
        concurrency: int | None = None,
    ) -> Plan:
        """One image per request, and per worker as many requests in flight as one batch's
        explanation budget admits (at least one, at most ``batchSize``): ``method`` and
        ``n_steps`` default to the describe answer's ``handler.explain`` settings."""
        entry = entry or {}
        per_target, budget = explain_budget(entry, method, n_steps)
        cost = per_target * max(1, targets)
        batch = int(entry.get("batchSize") or SERVER_DEFAULTS.batch_size)
        workers = max(1, len(entry.get("workers") or [None]))
        return cls(concurrency or workers * max(1, min(batch, budget // cost)), 1)


@dataclass
class Summary:
    """What a run did: files answered ok, failed, skipped as already done."""

    done: int = 0
    failed: int = 0
    skipped: int = 0
    seconds: float = 0.0
    cache_hits: int = 0  # images the server's content cache answered
    bytes_sent: int = 0  # request bodies on the wire (files, or crops made here)
    preprocessed: bool = False  # crops made here (--preprocess client)
    failures: list[tuple[str, str]] = field(default_factory=list)  # the first few

    def add(self, rows: list[Row], skipped: int, cache_hits: int = 0, keep: int = 20) -> None:
        self.skipped += skipped
        self.cache_hits += cache_hits
        for row in rows:
            if row.error:
                self.failed += 1
                if len(self.failures) < keep:  # the stored text: printable whatever the name
                    self.failures.append((stored_path(row.path)[0], row.error))
            else:
                self.done += 1


class Walk:
    """The paths a run's entries named (``vectors.path_hash``: 8 bytes a file), recorded as
    ``of`` passes them on, and whether every folder could be listed (``whole``: else a file
    not seen may still be there, and no row may be dropped for its absence)."""

    def __init__(self) -> None:
        self._hashes = array("Q")
        self.whole = True

    def of(self, entries: Iterable[Entry]) -> Iterator[Entry]:
        for entry in entries:
            self._hashes.append(path_hash(entry.path))
            self.whole = self.whole and not entry.unlisted
            yield entry

    def paths(self) -> np.ndarray:
        return np.frombuffer(self._hashes, np.uint64).copy()  # the array may grow again


class PartSink:
    """Rows into Parquet parts: a part every ``flush_rows`` rows or ``flush_s`` seconds,
    whichever comes first, so a kill loses the files in flight and at most ``flush_s`` of
    answered ones (Ctrl-C none: the close writes what is held); ``close(complete=True)``
    merges the parts into the output, keeping only the paths of ``walk`` when it saw the whole
    collection (``gone``: the rows it dropped).

    A part that cannot be written raises ``vectors.OutputError`` once: its rows are let go
    (their files are redone by the rerun), the parts before it stay, and nothing is written
    after it, so ``close`` cannot fail again on the same rows."""

    def __init__(
        self,
        output: Output,
        flush_rows: int = 1024,
        flush_s: float = 2.0,
        walk: Walk | None = None,
    ) -> None:
        self.output, self.walk = output, walk
        self.flush_rows, self.flush_s = flush_rows, flush_s
        self.rows: list[Row] = []
        self.gone = 0
        self._since = time.monotonic()
        self._failed = False

    def add(self, rows: list[Row]) -> None:
        self.rows += rows
        if len(self.rows) >= self.flush_rows:
            self.flush()

    def flush_if_due(self) -> None:
        if self.rows and time.monotonic() - self._since >= self.flush_s:
            self.flush()

    def flush(self) -> None:
        """The rows held as a part. They stay held until it is on disk: Ctrl-C during the write
        leaves them for ``close`` to write (written twice, they merge once)."""
        self._since = time.monotonic()
        if self.rows and not self._failed:
            try:
                self.output.write_part(self.rows)
            except Exception:
                self._failed, self.rows = True, []
                raise
        self.rows = []

    def close(self, complete: bool) -> None:
        self.flush()
        if complete and not self._failed:
            walked = self.walk.paths() if self.walk is not None and self.walk.whole else None
            self.gone = self.output.merge(walked)


class ListSink:
    """Rows kept in memory (``tsctl tag`` without ``--out``: a few files, answers printed)."""

    def __init__(self) -> None:
        self.rows: list[Row] = []

    def add(self, rows: list[Row]) -> None:
        self.rows += rows

    def flush_if_due(self) -> None:
        pass

    def close(self, complete: bool) -> None:
        pass


class Window:
    """How many requests a job keeps on the wire: additive increase, multiplicative decrease.
    Starts at ``most``; a refusal (503: the server holds bulk work back while people are
    served) halves it, at least 1; each answer grows it by one, up to ``most``. Refusals of
    requests sent before the last halving do not halve it again (they answer the window that
    was already cut), so a burst of refusals halves it once, as TCP's congestion window.
    ``enter`` blocks while the window is full (or until ``stopped``)."""

    def __init__(self, most: int) -> None:
        self.most = self.size = max(1, most)
        self.active = 0
        self._cuts = 0
        self._changed = threading.Condition()

    def enter(self, stopped: threading.Event) -> int:
        """Wait for room; returns the ticket ``refused`` takes."""
        with self._changed:
            while self.active >= self.size and not stopped.is_set():
                self._changed.wait(0.5)  # woken by leave(); the timeout only notices a stop
            self.active += 1
            return self._cuts

    def leave(self) -> None:
        with self._changed:
            self.active -= 1
            self._changed.notify_all()

    def refused(self, ticket: int) -> None:
        with self._changed:
            if ticket == self._cuts:
                self.size = max(1, self.size // 2)
                self._cuts += 1

    def answered(self) -> None:
        with self._changed:
            self.size = min(self.most, self.size + 1)
            self._changed.notify_all()


class Job:
    """One run over a stream of entries. ``task``: ``embedding``, ``tags`` or ``explain``
    (``explain``: the ``TorchServeClient.explain`` keywords, e.g. ``method``, ``png``; the
    plan must send one image per request); ``protocol``: KServe ``v2`` (default) or ``v1``;
    ``topk`` for tags; ``verify_sha256``: a file counts as done when its bytes hash to the
    stored sha256 (read again), instead of by size + mtime; ``traffic``: the requests' class
    (and deadline), ``bulk`` by default (explanations send none)."""

    def __init__(
        self,
        client: Client,
        model: str,
        task: str,
        sink,
        plan: Plan,
        *,
        protocol: str = "v2",
        topk: int | None = None,
        verify_sha256: bool = False,
        progress: JobProgress | None = None,
        max_outage_s: float = 120.0,
        max_busy_retries: int = 60,
        explain: dict | None = None,
        traffic: Traffic = BULK,
        crops: Callable[[bytes], np.ndarray] | None = None,
    ) -> None:
        if task == "explain" and plan.per_request != 1:
            raise ValueError(
                f"explanations go one image per request, the plan sends "
                f"{plan.per_request} (use Plan.for_explanations)"
            )
        self.client, self.model, self.task, self.sink, self.plan = client, model, task, sink, plan
        self.explain = explain or {}
        self.protocol, self.topk, self.verify_sha256 = protocol, topk, verify_sha256
        self.progress = progress or JobProgress(model, bar=False, every_s=float("inf"))
        self.max_outage_s, self.max_busy_retries = max_outage_s, max_busy_retries
        self.traffic = traffic
        self.crops = crops  # preprocess here (serveclient.preprocess.ClientCrops): send crops
        self.window = Window(plan.concurrency)
        self._stop = threading.Event()

    def run(self, entries: Iterable[Entry], done: DoneIndex | None = None) -> Summary:
        """Process every entry not in ``done``; rows go to the sink as they come. Stops (after
        writing what is answered, without merging) on a fatal error or Ctrl-C, and raises."""
        done = done or DoneIndex(np.zeros(0, np.uint64))
        summary = Summary()
        start, sent = time.monotonic(), self.client.bytes_sent
        summary.preprocessed = self.crops is not None
        pool = ThreadPoolExecutor(
            self.plan.concurrency,
            thread_name_prefix="tsctl-job",
            initializer=yield_thread if self.traffic.priority == "bulk" else None,
        )
        in_flight: set[Future] = set()
        complete = False
        try:
            for group in self._groups(entries, done, summary):
                while len(in_flight) >= self.plan.concurrency:
                    in_flight = self._collect(in_flight, summary)
                in_flight.add(pool.submit(self._process, group, done))
            while in_flight:
                in_flight = self._collect(in_flight, summary)
            complete = True
        finally:
            self._stop.set()
            pool.shutdown(wait=complete, cancel_futures=True)
            summary.seconds = time.monotonic() - start
            summary.bytes_sent = self.client.bytes_sent - sent
            self.progress.close()
            self.sink.close(complete)
        return summary

    # ------------------------------------------------------------------ the main thread

    def _groups(
        self, entries: Iterable[Entry], done: DoneIndex, summary: Summary
    ) -> Iterator[list[Entry]]:
        """Entries not done yet, in requests' worth: ``per_request`` files and at most
        ``max_request_bytes``."""
        group: list[Entry] = []
        size = 0
        for entry in entries:
            if not self.verify_sha256 and done.holds(entry.path, entry.size, entry.mtime_ns):
                summary.skipped += 1
                self.progress.update(skipped=1)
                continue
            if group and (
                len(group) >= self.plan.per_request
                or size + (entry.size or 0) > self.plan.max_request_bytes
            ):
                yield group
                group, size = [], 0
            group.append(entry)
            size += entry.size or 0
        if group:
            yield group

    def _collect(self, in_flight: set[Future], summary: Summary) -> set[Future]:
        """Wait for some requests (at most ``flush_s``), hand their rows to the sink."""
        finished, rest = wait(
            in_flight, timeout=getattr(self.sink, "flush_s", 2.0), return_when=FIRST_COMPLETED
        )
        for future in finished:
            rows, skipped, hits = future.result()  # a fatal error stops the job here
            summary.add(rows, skipped, hits)
            self.sink.add(rows)
            failed = sum(1 for r in rows if r.error)
            self.progress.update(done=len(rows) - failed, failed=failed, skipped=skipped)
        self.sink.flush_if_due()
        return rest

    # ------------------------------------------------------------------ worker threads

    def _process(self, group: list[Entry], done: DoneIndex) -> tuple[list[Row], int, int]:
        """Read the group's files, send them, return (rows, files skipped as unchanged, images
        the server's cache answered)."""
        rows: list[Row] = []
        sendable: list[tuple[Row, bytes]] = []
        skipped = 0
        for entry in group:
            if entry.error:
                rows.append(Row(entry.path, None, None, None, entry.error))
                continue
            row, data = _read(entry)
            if row.error is None and self.verify_sha256 and done.sha256_of(row.path) == row.sha256:
                skipped += 1
            elif row.error is None and self.crops is not None:
                self._crop_into(self.crops, row, data, sendable, rows)
            elif row.error is None:
                sendable.append((row, data))
            else:
                rows.append(row)
        if not sendable:
            return rows, skipped, 0
        hits = 0
        answers: Sequence[Answered | errors.ApiError]
        try:
            answers, hits = self._send([data for _, data in sendable])
        except FATAL:
            raise
        except errors.ApiError as exc:
            if len(sendable) == 1 or exc.status in RETRIED_STATUSES or exc.status >= 500:
                answers = [exc] * len(sendable)
            else:  # one bad image fails a request as a whole: find it
                answers = [self._send_or_error(data) for _, data in sendable]
                hits = sum(1 for a in answers if isinstance(a, Answered) and a.cached)
        for (row, _), answer in zip(sendable, answers):
            if isinstance(answer, errors.ServeError):
                row.error = answer.message
            else:
                row.answer, row.precision = self._checked(answer.value), answer.precision
                row.cached = answer.cached
            rows.append(row)
        return rows, skipped, hits

    def _crop_into(
        self,
        crops: Callable[[bytes], np.ndarray],
        row: Row,
        data: bytes,
        sendable: list,
        rows: list[Row],
    ) -> None:
        """The file's crop made here, to send; a bad image fails its row here, with the
        server's own message."""
        try:
            sendable.append((row, crops(data)))
        except Exception as exc:  # noqa: BLE001 - the core's RequestError, or PIL's own
            row.error = f"{type(exc).__name__}: {exc}"
            rows.append(row)

    def _pause(self, seconds: float) -> None:
        """Sleep between attempts, cut short when the job stops."""
        self._stop.wait(seconds)

    def _send_or_error(self, data: bytes) -> Answered | errors.ApiError:
        try:
            return self._send([data])[0][0]
        except FATAL:
            raise
        except errors.ApiError as exc:
            return exc

    def _send(self, images: list[bytes]) -> tuple[list[Answered], int]:
        """One request, retried while the server is busy (``max_busy_retries`` times) or
        unreachable (for ``max_outage_s``): each image's answer with the precision the server
        computed it in, and how many images its cache answered."""
        # A timed-out attempt alone may outlast max_outage_s: always try once more after one.
        outage = Retrying(
            retry=retry_if_exception_type(OUTAGE),
            wait=wait_exponential(multiplier=0.5, max=10),  # 0.5, 1, 2 ... 10 s
            stop=stop_after_delay(self.max_outage_s) & stop_after_attempt(2),
            sleep=self._pause,
            reraise=True,
        )
        busy = busy_retrying(stop_after_attempt(self.max_busy_retries + 1), self._stop.wait)
        try:
            answers = busy(outage, self._ask_unless_stopped, images)
        except (requests.Timeout, requests.ConnectionError) as exc:
            raise errors.ServerNotRunning(
                f"no answer for {self.max_outage_s:.0f} s: {exc}",
                "check the server; a rerun with the same --out resumes",
            ) from None
        if len(answers.values) != len(images):
            raise errors.ServeError(
                f"{len(images)} images sent, {len(answers.values)} answers came back",
                "is --url an endpoint of this runtime?",
            )
        cached = answers.cached or (False,) * len(images)
        return [
            Answered(value, answers.precision, hit) for value, hit in zip(answers.values, cached)
        ], answers.cache_hits

    def _ask_unless_stopped(self, images: list[bytes]) -> Answers:
        """``_ask`` within the window: a 503 narrows it, an answer widens it."""
        ticket = self.window.enter(self._stop)
        try:
            if self._stop.is_set():
                raise errors.ServeError("job stopped")
            answers = self._ask(images)
        except errors.ApiError as exc:
            if exc.status == 503:
                self.window.refused(ticket)
            raise
        finally:
            self.window.leave()
        self.window.answered()
        return answers

    def _ask(self, images: list[bytes]) -> Answers:
        """One request for ``images``, whatever the task."""
        if self.task == "explain":
            [image] = images  # Plan.for_explanations: one per request
            return Answers([self.client.explain(self.model, image, **self.explain)], None)
        if self.crops is not None:  # images are crops made here
            return self.client.infer_crops(
                self.model, np.stack(images), output=self.task, topk=self.topk, traffic=self.traffic
            )
        return self.client.infer_answers(
            self.model,
            images,
            output=self.task,
            protocol=self.protocol,
            topk=self.topk,
            traffic=self.traffic,
        )

    def _checked(self, answer):
        if self.task == "explain":
            return answer
        if self.task == "embedding":
            vector = np.asarray(answer, dtype=np.float32)
            if vector.shape != (EMBEDDING_DIM,):
                raise errors.ServeError(
                    f"an embedding of shape {vector.shape} came back, expected ({EMBEDDING_DIM},)"
                )
            return vector
        # A model with several heads names each tag's head; the Parquet's tag struct keeps
        # label, index (the served model's row: describe's heads say whose) and probability.
        return [{k: t[k] for k in TAG_FIELDS if k in t} for t in answer]


def explain_budget(entry: dict | None, method: str | None, n_steps: int | None) -> tuple[int, int]:
    """(passes one image and target costs, passes one batch may run) for a customized describe
    ``entry`` (the shipped defaults without one); ``method``/``n_steps`` None: the model's."""
    handler = ((entry or {}).get("customizedMetadata") or {}).get("handler") or {}
    explain = handler.get("explain") or {}
    method = method or explain.get("method") or SERVER_DEFAULTS.explain_method
    steps = int(n_steps or explain.get("n_steps") or SERVER_DEFAULTS.explain_n_steps)
    budget = explain.get("max_passes_per_batch") or SERVER_DEFAULTS.explain_max_passes_per_batch
    return explain_passes(method, steps), int(budget)


def explain_passes(method: str, n_steps: int) -> int:
    """Forward(+backward) passes per explained image and target, as the handler counts them
    (``servecore.explain.compute.passes``; the client does not import the server's package)."""
    return {"gradcam": 1, "ig": n_steps, "occlusion": OCCLUSION_PASSES}.get(method, n_steps)


def _read(entry: Entry) -> tuple[Row, bytes]:
    """The file's bytes and its row (size and mtime as opened, sha256 of the bytes); an error
    row for a file ``read_file`` refuses (not a regular file, over ``MAX_FILE_BYTES``)."""
    try:
        data, info = read_file(entry.path)
    except (OSError, ValueError) as exc:
        why = f"cannot read: {getattr(exc, 'strerror', None) or exc}"
        return Row(entry.path, entry.size, entry.mtime_ns, None, why), b""
    return Row(entry.path, info.st_size, info.st_mtime_ns, hashlib.sha256(data).hexdigest()), data


def described(
    client: Client, model: str, wait_s: float = DESCRIBE_WAIT_S, sleep=time.sleep
) -> dict:
    """The model's customized describe entry, waited for while the model is busy. TorchServe
    answers a customized describe through the model's own job queue: right after a job was
    killed, its requests still fill that queue and describe gets 503 until they are done."""
    return busy_retrying(stop_after_delay(wait_s), sleep)(client.describe, model, customized=True)[
        0
    ]


class wait_retry_after(wait_base):  # noqa: N801 - named like tenacity's own waits
    """tenacity's wait for a busy answer: the server's ``Retry-After`` when it sent one, else
    ``otherwise``'s."""

    def __init__(self, otherwise: wait_base) -> None:
        self.otherwise = otherwise

    def __call__(self, retry_state) -> float:
        after = getattr(retry_state.outcome.exception(), "retry_after", None)
        return after if after is not None else self.otherwise(retry_state)


def busy_retrying(stop, sleep) -> Retrying:
    """Retries while the server answers busy (503 full queue or budget, 507 worker died) until
    ``stop``, waiting ``Retry-After`` or 1, 2, 4, 8, 10, 10 ... s; the last refusal is raised."""
    return Retrying(
        retry=retry_if_exception(
            lambda e: isinstance(e, errors.ApiError) and e.status in RETRIED_STATUSES
        ),
        wait=wait_retry_after(wait_exponential(multiplier=1, max=10)),
        stop=stop,
        sleep=sleep,
        reraise=True,
    )


def yield_thread() -> None:
    """The calling thread, and every thread it starts from then on, runs only on CPU time
    nobody else wants (Linux ``SCHED_IDLE``; elsewhere it stays as it was): a bulk job run on
    the serving host takes no CPU from the people that host answers, and elsewhere costs
    nothing while the machine idles. Not undone: an unprivileged thread cannot leave it."""
    policy = getattr(os, "SCHED_IDLE", None)
    if policy is not None:
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, policy, os.sched_param(0))


def bulk_lane(client: Client, model: str, entry: dict | None) -> tuple[str, dict | None]:
    """Where a bulk job of ``model`` sends: the model's bulk lane (``handler.bulk_model`` in
    its describe, ``entry`` or asked now) when the server serves it, with the lane's describe
    entry (None where ``entry`` was None: no management API to plan from); else ``model`` and
    ``entry``. A server that cannot describe, or a lane not registered (a KServe runtime
    registers none), leaves the job on ``model``."""
    known = entry
    if known is None:
        with contextlib.suppress(errors.ServeError, requests.RequestException):
            known = client.describe(model, customized=True)[0]
    custom = (known or {}).get("customizedMetadata")
    lane = ((custom if isinstance(custom, dict) else {}).get("handler") or {}).get("bulk_model")
    if not lane or lane == model:
        return model, entry
    try:
        lane_entry = client.describe(lane, customized=True)[0]
    except (errors.ServeError, requests.RequestException):
        return model, entry
    return lane, lane_entry if entry is not None else None


def model_identity(
    client: Client, model: str, with_management: bool = True
) -> tuple[dict | None, dict]:
    """(the customized describe entry, or None without a management API (a TorchServe behind
    ``--url``) or without its key (a token for inference alone: the job needs no more); the
    metadata stored with the rows: model, version, precision, backend, weights fingerprint)."""
    undescribed = {
        "model": model,
        "model_version": None,
        "weights_sha256": None,
        "endpoint": client.urls["inference"],
    }
    if not with_management:
        return None, undescribed
    try:
        entry = described(client, model)
    except errors.KeyRejected:  # the job itself needs only the inference key
        return None, undescribed
    custom = entry.get("customizedMetadata")
    custom = custom if isinstance(custom, dict) else {}
    weights = custom.get("weights") or {}
    return entry, {
        "model": entry.get("modelName", model),
        "model_version": entry.get("modelVersion"),
        "precision": custom.get("precision"),
        "backend": custom.get("backend"),
        "quantization": custom.get("quantization"),
        "weights_sha256": weights.get("sha256"),
        "weights_source": weights.get("source"),
        "weights_trained": weights.get("trained"),
        "endpoint": client.urls["inference"],
    }
