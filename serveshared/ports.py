"""Where a local TorchServe listens by default: the one place these ports are written.

``make config`` writes them into config/config.properties (buildsteps/configgen.py), and
``TorchServeClient`` and ``tsctl`` reach a server there unless told otherwise. The KServe
configurations bind their own addresses (kserve/*server.properties).
"""

from __future__ import annotations

HOST = "127.0.0.1"  # loopback only: put a proxy or KServe in front to expose it
INFERENCE = 8080
MANAGEMENT = 8081
METRICS = 8082
# A local Triton (make serve-triton, tritonrepo/server.py): Triton's own defaults, which
# leave TorchServe's free so both can run side by side.
TRITON_HTTP = 8000
TRITON_GRPC = 8001
TRITON_METRICS = 8002


def url(port: int, host: str = HOST) -> str:
    """``http://host:port``, the form of TorchServe's ``*_address`` settings."""
    return f"http://{host}:{port}"


INFERENCE_URL = url(INFERENCE)
MANAGEMENT_URL = url(MANAGEMENT)
METRICS_URL = url(METRICS)
