"""The storage bundle as a modelcar (``make kserve-modelcar``): an OCI image holding it under
``/models``, for ``storageUri: oci://...`` (kserve/overlays/modelcar).

    python -m kserve_tools.modelcar [--device cpu|gpu] [--model-version 1.0] [--base debian|IMAGE]

What KServe asks of the image (``CreateModelcarContainer`` and ``CreateModelcarInitContainer``,
kserve/kserve ``pkg/utils``): the model files under ``/models``; ``sh``, ``ln`` and ``sleep``
for the sidecar it adds (args only, no command: ``sh -c "ln -sf /proc/$$/root/models
/mnt/models && sleep infinity"``), ``ls`` and ``[`` for the check it runs first (``/models``
a non-empty folder). So the image is FROM the runtime image's own base
(``kserve_tools.image.resolve_base``: the debootstrapped Debian 12, or ``--base IMAGE``): a node
that runs our runtime holds that layer already, and pulls only the bundle's.

The files are root's (the runtime reads them, cannot change them) and the image runs as uid
1000, the runtime's ``runAsUser``: the runtime reaches them through
``/proc/<modelcar pid>/root``, which the kernel opens only to a process of the same user, so
no cluster-wide ``uidModelcar`` is needed (KServe would also replace the runtime container's
whole securityContext with that user alone).

Cached like the runtime image: tagged ``localhost/<bundle name>:<version>-<key>`` (the key
hashes the Containerfile, the base image's id and the bundle's files, by content) and
``localhost/<bundle name>:<version>``; an image with the current key is reused.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
from pathlib import Path

from buildsteps.configgen import REPO, VERSION
from kserve_tools.bundle import DEVICES, bundle_name
from kserve_tools.engine import base_command
from kserve_tools.image import image_id, resolve_base

MODELS = "/models"  # where KServe's modelcar looks
UID = 1000  # kserve/runtime's runAsUser
CONTAINERFILE = f"""FROM {{base}}
COPY --chown=0:0 . {MODELS}/
USER {UID}:{UID}
"""


def files(bundle: Path) -> list[Path]:
    """The bundle's files, sorted."""
    return sorted(p for p in bundle.rglob("*") if p.is_file())


def cache_key(bundle: Path, containerfile: str, base_id: str) -> str:
    """12 hex digits of what decides the image's content."""
    digest = hashlib.sha256(containerfile.encode() + base_id.encode())
    for path in files(bundle):
        digest.update(str(path.relative_to(bundle)).encode() + b"\0")
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()[:12]


def build(bundle: Path, version: str = VERSION, base: str = "debian") -> str:
    """Build (or reuse) the modelcar of ``bundle`` (a ``make kserve-bundle`` folder); returns
    its keyed reference."""
    bundle = Path(bundle).resolve()
    if not (bundle / "config" / "serve.sh").is_file() or not list(bundle.glob("model-store/*")):
        raise SystemExit(
            f"{bundle} is no storage bundle (config/serve.sh and model-store/ expected): "
            "run `make kserve-bundle` first"
        )
    base_ref, base_id = resolve_base(base)
    containerfile = CONTAINERFILE.format(base=base_ref)
    name = f"localhost/{bundle.name}"
    ref = f"{name}:{version}-{cache_key(bundle, containerfile, base_id)}"
    if image_id(ref) is None:
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "Containerfile").write_text(containerfile)
            subprocess.run(
                [
                    *base_command(),
                    "build",
                    "--network",
                    "none",
                    "--label",
                    f"org.opencontainers.image.base.name={base_ref}",
                    "-f",
                    str(Path(tmp) / "Containerfile"),
                    "-t",
                    ref,
                    str(bundle),
                ],
                check=True,
            )
    subprocess.run([*base_command(), "tag", ref, f"{name}:{version}"], check=True)
    return ref


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kserve_tools.modelcar", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--out", type=Path, default=REPO / "build" / "kserve", help="bundles' folder"
    )
    parser.add_argument("--device", choices=DEVICES, default="cpu")
    parser.add_argument("--model-version", default=VERSION)
    parser.add_argument(
        "--base",
        default="debian",
        help="'debian' (debootstrapped here) or an image: the runtime image's base",
    )
    args = parser.parse_args(argv)
    bundle = args.out / bundle_name(args.device, args.model_version)
    print(build(bundle, args.model_version, args.base))
    print(f"push it, then set storageUri: oci://REGISTRY/{bundle.name}:<tag>", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
