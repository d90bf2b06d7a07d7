#!/usr/bin/env bash
# The KServe lint and tests render kserve/'s kustomizations with `kubectl kustomize`, the tool
# users apply them with. Check for it; where apt-get offers a kubectl package (root or
# passwordless sudo), install it; otherwise stop with what to do.
set -euo pipefail
# shellcheck source=devtools/apt.sh
. "$(dirname "$0")/apt.sh"

has_kustomize() {
  command -v kubectl >/dev/null 2>&1 && kubectl kustomize --help >/dev/null 2>&1
}

if has_kustomize; then
  exit 0
fi

echo "kubectl with kustomize not found: it renders kserve/'s manifests for make kserve-lint and tests/test_kserve*.py." >&2
if can_apt; then
  # Only Kubernetes' or Google Cloud's apt repositories carry kubectl; skip when none is set up.
  candidate=$(apt-cache policy kubectl 2>/dev/null | sed -n 's/^ *Candidate: *//p')
  if [ -n "$candidate" ] && [ "$candidate" != "(none)" ]; then
    echo "Installing kubectl $candidate with apt-get..." >&2
    apt_install kubectl
    hash -r
  fi
fi
if ! has_kustomize; then
  cat >&2 <<'MSG'
error: kubectl (1.14 or newer, which bundles kustomize) is required to render the kustomizations
of kserve/ for `make kserve-lint` and the KServe tests, and could not be installed automatically.
  Any OS:         https://kubernetes.io/docs/tasks/tools/#kubectl
  Debian/Ubuntu:  add Kubernetes' apt repository (https://pkgs.k8s.io, see the page above),
                  then: sudo apt-get update && sudo apt-get install -y kubectl
  macOS:          brew install kubectl
Then make sure `kubectl kustomize --help` works, and re-run the make command.
MSG
  exit 1
fi
echo "kubectl is ready: $(kubectl version --client 2>/dev/null | head -n1)." >&2
