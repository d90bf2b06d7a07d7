"""A batch's requests through open, admit and decode, each request on its own.

Each request is parsed and its images' headers read on its own (``Intake.open``; an explanation
request's parameters are checked in between, by the model's ``ExplainRules``, before any image
is read; a request whose deadline has passed is answered 504 before it is even parsed); the
batch's work is admitted
within its budgets (``servecore.admission``: the bulk share, forward rows, decoded pixels,
explanation passes) before anything is decoded; the admitted images are decoded on a small
thread pool (PIL and numpy release the GIL), each into its row of the batch's CPU tensor
(made first, so no copy joins the crops); on a CUDA worker with ``gpu_decode`` on, the JPEGs
its GPU decodes go there in one batched call (``servecore.gpudecode``) while the pool decodes
the rest, and the batch is stacked on the GPU; a GPU worker that overlaps (``servecore.overlap``)
decodes the admitted requests in parts, queuing each part's forward before decoding the next.
Whatever goes wrong fails its own request only (``servecore.boundary``).

Imports ``servecore.explain.options``: what an explanation request may ask (``ExplainRules``, a
value) and what its passes cost of the batch's budget; the explanation stage that computes them
(``servecore.explain.explanations``) is not the intake's: ``ImageModel.run`` enters it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from functools import partial

import torch

from model_files.recipe import ROW
from servecore.admission import Admission, Budget
from servecore.boundary import attempt, each_image
from servecore.classes import Classes
from servecore.config import MAX_DECODE_THREADS, HandlerConfig
from servecore.crops import GivenCrop
from servecore.errors import DeadlineExceeded, detached
from servecore.explain.options import ExplainRules
from servecore.gpuchoice import for_worker
from servecore.gpudecode import DeviceDecoder, accepts, assemble
from servecore.host import usable_cpus
from servecore.images import OpenedImage
from servecore.overlap import Outputs, Overlap
from servecore.preprocessor import Preprocessor
from servecore.request import check_top_k
from servecore.stages import (
    Admitted,
    Explaining,
    Failed,
    Incoming,
    Opened,
    Placed,
    PreparedBatch,
    State,
)
from serveshared.wire import DEADLINE_HEADER

CPU = torch.device("cpu")


class Intake:
    """Turns one batch of ``Incoming`` requests into a ``PreparedBatch``. ``clock``: Unix
    time in seconds, what deadlines and the interactive window are counted on.
    ``device_decoder``: the GPU's JPEG decoder (``handler.gpu_decode``), None when off;
    ``decoder_choice``: which decoder that is and why (describe's ``gpu``). ``classes``: the
    model's (what ``topk`` may ask); ``explain``: what an explanation request may ask."""

    def __init__(
        self,
        config: HandlerConfig,
        classes: Classes,
        explain: ExplainRules,
        clock: Callable[[], float] = time.time,
        lookup: Callable[[list[Admitted]], list[Admitted]] = list,
        device: torch.device = CPU,
    ) -> None:
        self.config = config
        self.classes = classes
        self.explain = explain
        self.admission = Admission()  # the worker's budgets over time (who is owed a turn)
        self.clock = clock
        self.lookup = lookup  # between admission and decode: the content cache's step
        self.preprocessor = Preprocessor(config)
        self.budgets = (
            Budget(
                "max_batch_images",
                "images",
                config.max_batch_images,
                lambda request: request.image_count,
            ),
            Budget(
                "max_batch_pixels",
                "decoded pixels",
                config.max_batch_pixels,
                lambda request: request.pixel_count,
            ),
            explain.budget,
        )
        self.bulk_share = Budget(
            "bulk_batch_images",
            "forward rows for bulk requests while interactive traffic is about",
            config.bulk_batch_images,
            lambda request: request.image_count,
        )
        self.threads = config.decode_threads or decode_threads(device)
        self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix="decode")
        self.device_decoder: DeviceDecoder | None
        self.device_decoder, self.decoder_choice = for_worker(
            config.gpu_decode, device, config.max_batch_pixels
        )

    def prepare(
        self, incoming: Sequence[Incoming], overlap: Overlap | None = None
    ) -> PreparedBatch:
        """Each request opened, the batch's work admitted, the cache's answers looked up, the
        rest decoded and stacked; ``open_ms`` is the time to the decode. With ``overlap`` (a GPU
        worker's), decoded in its parts, each part's forward queued before the next part is
        decoded (``forwarded``; ``decode_ms`` then includes queuing them). ``gpu_refused``: the
        images the device decoder gave back to the CPU path (None without one)."""
        started, now = time.perf_counter(), self.clock()
        opened = [self.open(request, now) for request in incoming]
        admitted = self.lookup(self.admit(opened, now))
        decoding = time.perf_counter()
        refusals = None if self.device_decoder is None else self.device_decoder.refusals
        refused = 0 if refusals is None else refusals.refused
        forwarded: list[Outputs] = []
        if overlap is None:
            states, batch = self._decode(admitted)
        else:
            states, batch = self._overlapped(admitted, overlap, forwarded)
        return PreparedBatch(
            tuple(states),
            batch,
            open_ms=1000 * (decoding - started),
            decode_ms=1000 * (time.perf_counter() - decoding),
            forwarded=tuple(forwarded),
            gpu_refused=None if refusals is None else refusals.refused - refused,
        )

    def _overlapped(
        self, requests: Sequence[Admitted], overlap: Overlap, forwarded: list[Outputs]
    ) -> tuple[list[State], torch.Tensor | None]:
        """``_decode`` of each of ``overlap``'s parts in turn, on its decode stream, each
        part on the device (``Overlap.staged``: a part the CPU decoded whole is copied over
        there) and its forward queued (into ``forwarded``) before the next is decoded; the
        parts' rows numbered on from the last, joined on the device."""
        states: list[State] = []
        parts: list[torch.Tensor] = []
        rows = 0
        for part in overlap.parts(requests):
            with overlap.decoding():
                decoded, pixels = self._decode(part)
                if pixels is not None:
                    pixels = overlap.staged(pixels)
            for state in decoded:
                if isinstance(state, Placed):
                    moved = range(state.rows.start + rows, state.rows.stop + rows)
                    state = dataclasses.replace(state, rows=moved)
                states.append(state)
            if pixels is not None:
                forwarded += overlap.launch(pixels)
                parts.append(pixels)
                rows += len(pixels)
        if not parts:
            return states, None
        return states, parts[0] if len(parts) == 1 else torch.cat(parts)

    def admit(self, requests: list[Admitted], now: float) -> list[Admitted]:
        """The batch's work within its budgets, in order: the bulk share, forward rows and
        decoded pixels, explanation passes; what is let through is recorded as served."""
        window_s = self.config.interactive_window_ms / 1000
        requests = self.admission.bulk_share(requests, self.bulk_share, window_s, now)
        for budget in self.budgets:
            requests = self.admission.within(requests, budget)
        self.admission.served(requests)
        return requests

    def open(self, incoming: Incoming, now: float | None = None) -> Opened | Failed:
        """Parse one request and read its images' headers: an ``Explaining`` when it came on
        an explanation route, else an ``Opened``, or its ``Failed``; 504 ``DeadlineExceeded``,
        unparsed, when its deadline is not after ``now`` (default: the clock's time)."""
        now = self.clock() if now is None else now
        if incoming.deadline is not None and incoming.deadline <= now:
            return Failed(
                incoming.request_id,
                DeadlineExceeded(
                    f"the request's deadline ({DEADLINE_HEADER} {incoming.deadline:.3f}) passed "
                    f"{now - incoming.deadline:.3f} s before its batch ran (server time "
                    f"{now:.3f}); it was not computed. Send a later deadline, or none"
                ),
            )
        return attempt(incoming.request_id, "parsing", partial(self._open, incoming))

    def _open(self, incoming: Incoming) -> Opened:
        request = incoming.parse(self.config)
        check_top_k(
            request,
            self.classes.largest,
            "the classes of the model's largest head"
            if self.classes.named
            else "the model's classes",
        )
        priority = incoming.priority if request.priority is None else request.priority
        if incoming.explain:
            spec = self.explain.spec(request)
            images = self.preprocessor.read(incoming.request_id, request)
            return Explaining(incoming.request_id, request, images, spec, priority=priority)
        self.explain.refuse_options(request)
        images = self.preprocessor.read(incoming.request_id, request)
        return Opened(incoming.request_id, request, images, priority=priority)

    def _decode(self, requests: Sequence[Admitted]) -> tuple[list[State], torch.Tensor | None]:
        """The admitted requests' images as the batch tensor, in order (None: no image); a
        request whose image fails becomes its ``Failed`` and gets no rows."""
        slots, tasks, rows = self._start(requests)
        wait(tasks)  # the pool's tasks, each a share of the batch: one wait each, not per image
        states: list[State] = []
        tensors: list[torch.Tensor] = []
        kept: list[int] = []  # the slots of the placed requests' images
        at = 0
        for request in requests:
            first, at = at, at + (len(request.images) if isinstance(request, Opened) else 0)
            if isinstance(request, Failed):
                states.append(request)
                continue
            decoded = attempt(
                request.request_id,
                "decoding",
                partial(
                    each_image, request.request_id, "decoding", slots[first:at], Pending.result
                ),
            )
            if isinstance(decoded, Failed):
                states.append(decoded)
                continue
            states.append(Placed(request, range(len(tensors), len(tensors) + len(decoded))))
            tensors.extend(decoded)
            kept.extend(range(first, at))
        if not tensors:
            return states, None
        if rows is not None:  # the crops were written into its rows: no copy unless one failed
            return states, rows if len(kept) == len(rows) else rows[kept]
        decoder = self.device_decoder
        return states, assemble(tensors, None if decoder is None else decoder.device)

    def _start(
        self, requests: Sequence[Admitted]
    ) -> tuple[list[Pending], list[Future], torch.Tensor | None]:
        """One slot per admitted image, in order, the pool's tasks that fill them (the slots
        are read once those are done), and without a device decoder the batch tensor whose rows
        they are written into. The images the device decoder accepts (not an explanation's: the
        explainer draws on the decoded picture) go to it in one call while the pool decodes the
        others; what it refuses goes to the pool after, and the batch is assembled from the
        crops."""
        decoder = self.device_decoder
        images = [
            (image, not isinstance(r, Explaining))  # plain: not an explanation's image
            for r in requests
            if isinstance(r, Opened)
            for image in r.images
        ]
        rows = None
        if decoder is None:
            rows = torch.empty((len(images), *ROW), dtype=torch.uint8)
            slots = dict(enumerate(map(Pending, rows.unbind())))
        else:
            slots = {k: Pending() for k in range(len(images))}
        turns = {
            k: accepts(image)  # the EXIF orientation, read once; None: not for the device
            for k, (image, plain) in enumerate(images)
            # a crop the request carried is the input already
            if decoder is not None and plain and isinstance(image, OpenedImage)
        }
        routed: dict[int, OpenedImage] = {
            k: image
            for k, (image, _) in enumerate(images)
            if turns.get(k) is not None and isinstance(image, OpenedImage)
        }
        pooled = [(k, image) for k, (image, _) in enumerate(images) if k not in routed]
        # The pool's tasks start before the device's call: they overlap.
        tasks = self._shared_out([(image, slots[k]) for k, image in pooled], len(images) == 1)
        if decoder is not None and routed:  # routed is empty without a decoder: for mypy
            crops = decoder(list(routed.values()), [turns[k] or 1 for k in routed])
            refused: list[tuple[OpenedImage | GivenCrop, Pending]] = []
            for (k, image), crop in zip(routed.items(), crops, strict=True):
                if crop is None:
                    refused.append((image, slots[k]))
                slots[k].crop = crop
            tasks += self._shared_out(refused, len(refused) == 1)
        return [slots[k] for k in range(len(images))], tasks, rows

    def _shared_out(
        self, images: list[tuple[OpenedImage | GivenCrop, Pending]], here: bool
    ) -> list[Future]:
        """Each image decoded into its slot: on this thread when ``here`` (one image is not
        worth a thread hop), else dealt out to one pool task per thread (largest first, each
        to the task with the fewest pixels so far), each task decoding its share in turn, so
        a batch costs the pool a hand-off and a future per thread, not one per image (each
        wakes a thread; one per image was a tenth of the null model's CPU per image on Triton,
        issue #49)."""
        if here:
            _decode_share(self.preprocessor.decode, images, Exception)
            return []
        shares: list[list[tuple[OpenedImage | GivenCrop, Pending]]] = [
            [] for _ in range(min(self.threads, len(images)))
        ]
        pixels = [0] * len(shares)
        for image, slot in sorted(images, key=lambda item: -item[0].pixels):
            least = pixels.index(min(pixels))
            pixels[least] += image.pixels + 1  # + 1: crops, which cost no pixels, spread too
            shares[least].append((image, slot))
        return [self.pool.submit(_decode_share, self.preprocessor.decode, s) for s in shares]


def decode_threads(device: torch.device) -> int:
    """``handler.decode_threads: 0``: on a CPU worker one thread per usable core, at most
    ``MAX_DECODE_THREADS`` (the forward needs the cores too); on a GPU worker every usable core,
    since the forward runs on the GPU and the cores' only work is preparing its input."""
    cores = usable_cpus()
    return cores if device.type == "cuda" else min(MAX_DECODE_THREADS, cores)


class Pending:
    """One image's crop, or what decoding it raised, set once by whoever decodes it: a pool
    task decoding a share of the batch, the device decoder, or this thread. Read once the
    tasks are done (``Intake._decode`` waits for them). Lighter than a ``Future`` per image:
    no lock of its own, nothing to wake."""

    __slots__ = ("crop", "out", "raised")

    def __init__(self, out: torch.Tensor | None = None) -> None:
        self.crop: torch.Tensor | None = None
        self.out = out  # the batch's row to decode into, when the batch is made first
        self.raised: BaseException | None = None

    def result(self) -> torch.Tensor:
        """The crop; what decoding raised, raised here."""
        if self.crop is not None:
            return self.crop
        try:
            raise self.raised or RuntimeError("an image's crop was read before it was decoded")
        finally:  # the error's traceback holds this frame: not the slot too (as Future does)
            del self


def _decode_share(
    decode: Callable[[OpenedImage | GivenCrop, torch.Tensor | None], torch.Tensor],
    share: list[tuple[OpenedImage | GivenCrop, Pending]],
    caught: type[BaseException] = BaseException,
) -> None:
    """Each image of ``share`` decoded into its slot, in turn: its crop, or what it raised
    (every slot is set, whatever an image raises; ``caught``: on the serving thread itself,
    ``Exception``, so that an interrupt still ends the worker)."""
    for image, slot in share:
        try:
            slot.crop = decode(image, slot.out)
        except caught as exc:  # raised again where the crop is read, as Future would
            slot.raised = detached(exc)  # else exc -> this frame -> share -> slot -> exc
