"""Memory of the pods serving our runtime: a request and a limit Kubernetes can read (its own
quantity parser, ``kubernetes.utils.parse_quantity``) and at least the measured footprint."""

from __future__ import annotations

import math
from collections.abc import Iterator

from kubernetes.utils import parse_quantity

from kserve_tools.lint.base import Problem

# Measured (kserve/README.md "Memory"): frontend at its heap + direct-memory ceiling during a
# burst of 32 MiB bodies (4.4 GiB) + both workers after it (1.3 + 1.7 GiB), rounded up.
FOOTPRINT_GIB = 7.5
TORCHSERVE = "frontend and workers"
# Our Triton runtime (kserve/README.md, Triton): the server with both models' stubs (1.8 GB at
# most under make bench's load; tests/test_kserve_triton_image.py holds the container below
# it) plus its memory-backed /dev/shm (sizeLimit 1Gi), rounded up.
TRITON_FOOTPRINT_GIB = 3.0
TRITON = "Triton, both models' stubs and /dev/shm"


def memory_problems(
    path: str, resources: dict | None, footprint: float = FOOTPRINT_GIB, what: str = TORCHSERVE
) -> Iterator[Problem]:
    """A memory request or limit under ``path`` (a container's ``resources``) that is missing,
    not a Kubernetes quantity, or below ``footprint`` GiB (the measured footprint of
    ``what``)."""
    for kind in ("requests", "limits"):
        value = ((resources or {}).get(kind) or {}).get("memory")
        try:
            size = parse_quantity(value) if value is not None else None
        except ValueError:
            yield Problem(
                f"{path}.{kind}.memory",
                f"{value!r} is not a Kubernetes quantity: the API server refuses the object",
                f"write a quantity such as 8Gi (at least {footprint} GiB)",
            )
            continue
        if size is None or size < footprint * 2**30:
            yield Problem(
                f"{path}.{kind}.memory",
                f"{value!r} is below the measured footprint "
                f"of {what} ({footprint} GiB, kserve/README.md): a "
                "burst of large bodies gets the pod OOM-killed",
                f"set it to at least {footprint} GiB ({math.ceil(footprint)}Gi)",
            )
