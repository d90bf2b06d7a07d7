"""``LocalTorchServe.attach``, what the benchmarks' ``--attach DIR`` runs: it reads the ports and
model store from the config.properties a start wrote in DIR, and says so when DIR holds none."""

from __future__ import annotations

import pytest

from buildsteps.configgen import rewrite_properties
from devtools.server import DEFAULT_CONFIG, LocalTorchServe, NotStartedHere, port_properties

PORTS = {
    "inference": 20101,
    "management": 20102,
    "metrics": 20103,
    "grpc_inference": 20104,
    "grpc_management": 20105,
}


def test_attach_reads_the_ports_and_store_a_start_wrote(tmp_path):
    store = tmp_path / "store"
    written = rewrite_properties(
        DEFAULT_CONFIG.read_text(), {**port_properties(PORTS), "model_store": str(store)}
    )
    (tmp_path / "config.properties").write_text(written)
    server = LocalTorchServe.attach(tmp_path)
    assert server.ports == PORTS
    assert server.model_store == store
    assert not server.owned


def test_attach_to_a_folder_without_a_server_says_so(tmp_path):
    with pytest.raises(NotStartedHere, match=r"no config\.properties, so no server"):
        LocalTorchServe.attach(tmp_path)
