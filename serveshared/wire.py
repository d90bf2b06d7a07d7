"""The HTTP header names both sides of the wire write: the servers' edges read or set them, the
client sends or reads them. One place, so a renamed header cannot drift between the two
(HTTP header names are case-insensitive: each side compares them so)."""

# Sent by clients.
TOP_K_HEADER = "X-Top-K"  # how many tags, when the body does not say (TorchServe, transformer)
PRIORITY_HEADER = "X-Priority"  # interactive | bulk (servecore.priority)
DEADLINE_HEADER = "X-Deadline"  # Unix seconds after which the answer is useless

# Set by the HTTP edge on every answer (servecore.edges.http).
BATCH_HEADER = "X-Batch-Size"  # how many requests the engine batched with this one
PRECISION_HEADER = "X-Precision"  # the arithmetic that computed this answer
CACHE_HITS_HEADER = "X-Cache-Hits"  # how many of its images the content cache answered (cache on)
