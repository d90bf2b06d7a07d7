#!/usr/bin/env bash
# The runtime image (make kserve-image, kserve-image-test) is built and run with podman or
# docker. Check for one; where apt-get can install packages (root or passwordless sudo),
# install podman with runc (crun refuses hosts with hybrid cgroups) and debootstrap (the
# Debian base image, made without a registry); otherwise stop with what to do.
set -euo pipefail
# shellcheck source=devtools/apt.sh
. "$(dirname "$0")/apt.sh"

has_engine() {
  command -v podman >/dev/null 2>&1 || { command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; }
}

if has_engine && { command -v debootstrap >/dev/null 2>&1 || [ "${KSERVE_BASE:-debian}" != debian ]; }; then
  exit 0
fi

echo "A container engine (podman or docker) and debootstrap are needed for the runtime image." >&2
if can_apt; then
  echo "Installing podman, runc and debootstrap with apt-get..." >&2
  apt_update
  apt_install podman runc debootstrap
  hash -r
fi
if ! has_engine; then
  cat >&2 <<'MSG'
error: podman (or a running docker) is required to build and test the runtime image, and could
not be installed automatically.
  Debian/Ubuntu:  sudo apt-get install -y podman runc debootstrap
  Fedora/RHEL:    sudo dnf install -y podman
  Elsewhere:      https://podman.io/docs/installation (or Docker)
Then re-run the make command (KSERVE_BASE=python:3.11-slim-bookworm where a registry is
reachable and debootstrap is not at hand).
MSG
  exit 1
fi
if [ "${KSERVE_BASE:-debian}" = debian ] && ! command -v debootstrap >/dev/null 2>&1; then
  echo "error: debootstrap is needed for the Debian base (KSERVE_BASE=debian); install it, or pass KSERVE_BASE=python:3.11-slim-bookworm" >&2
  exit 1
fi
echo "container engine ready: $(command -v podman || command -v docker)." >&2
