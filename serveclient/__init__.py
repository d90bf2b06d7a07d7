"""Client side of a running server (TorchServe or Triton): the Python API (``Client``, chosen by
``connect``; ``TorchServeClient``, ``TritonClient``), its keys and errors, and the ``tsctl``
command line (``serveclient.cli``).

    client.py      ``connect`` and the public names; base.py: ``Client``, what every engine's
                   client offers; torchserve.py and triton.py: the two engines' clients
    engine.py      which engine answers at a URL
    errors.py      every failure a client can meet, with its exit code and hint
    traffic.py     a request's class and deadline on the wire
    preprocess.py  client-side preprocessing into crops
    jobs.py        embed or tag a whole collection into Parquet, resumably, as one call (what
                   tsctl tag/embed print); batchjob.py: the job's sending, retries and sinks;
                   collection.py: the photos as a stream of files; vectors.py: the Parquet
                   parts; objectstore.py: outputs in an object store; progress.py: its bar
    search/        one ``VectorSearch`` over the collection's vectors, chosen by ``open``:
                   exact cosine over the Parquet, the FAISS index folder, or Milvus
    head.py        a linear head for the user's own labels, fitted on served embeddings and
                   folded into a checkpoint (``train``: what tsctl head train prints)
    outputlock.py  one writer per output folder or file (embed, index build, head train)
    pages.py       self-contained HTML pages of results
    metrics.py     TorchServe's and Triton's Prometheus text, summarised; gpus.py: the GPUs'
                   use and memory, as the server's /metrics reports them
    top.py         ``tsctl top``'s live view
    cli/           the ``tsctl`` command line
"""

from typing import TYPE_CHECKING

from serveclient.client import (
    Client,
    TorchServeClient,
    TritonClient,
    check_archive,
    check_name,
    connect,
)
from serveclient.errors import ServeError
from serveshared.keys import Keys

if not TYPE_CHECKING:
    from serveclient.errors import __getattr__ as __getattr__  # TsError: ServeError, warned

__all__ = [
    "Client",
    "Keys",
    "ServeError",
    "TorchServeClient",
    "TritonClient",
    "check_archive",
    "check_name",
    "connect",
]
