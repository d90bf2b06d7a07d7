"""The names and numbers both sides of the wire write: the servers' edges read or set them, the
client sends or reads them. One place, so a renamed header or a renumbered class cannot drift
between the two (HTTP header names are case-insensitive: each side compares them so)."""

import enum


class Priority(enum.IntEnum):
    """A request's class, numbered as Triton's priority levels (1 is served first): a person
    waiting (the servers' default), or a collection job that can wait and retry."""

    INTERACTIVE = 1
    BULK = 2


PRIORITY_KEY = "priority"  # the KServe v2 request parameter (Triton's reserved key)
TIMEOUT_KEY = "timeout"  # Triton's v2 request parameter, microseconds from arrival

# Sent by clients.
TOP_K_HEADER = "X-Top-K"  # how many tags, when the body does not say (TorchServe, transformer)
PRIORITY_HEADER = "X-Priority"  # interactive | bulk, or 1 | 2 (Priority)
DEADLINE_HEADER = "X-Deadline"  # Unix seconds after which the answer is useless

# Set by the HTTP edge on every answer (servecore.edges.http).
BATCH_HEADER = "X-Batch-Size"  # how many requests the engine batched with this one
PRECISION_HEADER = "X-Precision"  # the arithmetic that computed this answer
CACHE_HITS_HEADER = "X-Cache-Hits"  # how many of its images the content cache answered (cache on)
