"""Memory of the pods serving our runtime: a request and a limit Kubernetes can read (its own
quantity parser, ``kubernetes.utils.parse_quantity``) and at least the measured footprint."""

from __future__ import annotations

from typing import Iterator

from kubernetes.utils import parse_quantity

from kserve_tools.lint.base import Problem

# Measured (kserve/README.md "Memory"): frontend at its heap + direct-memory ceiling during a
# burst of 32 MiB bodies (4.4 GiB) + both workers after it (1.3 + 1.7 GiB), rounded up.
FOOTPRINT_GIB = 7.5


def memory_problems(path: str, resources: dict | None) -> Iterator[Problem]:
    """A memory request or limit under ``path`` (a container's ``resources``) that is missing,
    not a Kubernetes quantity, or below ``FOOTPRINT_GIB``."""
    for kind in ("requests", "limits"):
        value = ((resources or {}).get(kind) or {}).get("memory")
        try:
            size = parse_quantity(value) if value is not None else None
        except ValueError:
            yield Problem(
                f"{path}.{kind}.memory",
                f"{value!r} is not a Kubernetes quantity: the API server refuses the object",
                f"write a quantity such as 8Gi (at least {FOOTPRINT_GIB} GiB)",
            )
            continue
        if size is None or size < FOOTPRINT_GIB * 2**30:
            yield Problem(
                f"{path}.{kind}.memory",
                f"{value!r} is below the measured footprint "
                f"of frontend and workers ({FOOTPRINT_GIB} GiB, kserve/README.md): a "
                "burst of large bodies gets the pod OOM-killed",
                f"set it to at least {FOOTPRINT_GIB} GiB (8Gi)",
            )
