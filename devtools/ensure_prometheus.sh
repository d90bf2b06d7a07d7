#!/usr/bin/env bash
# The monitoring rules are checked and unit-tested with promtool, an integration test runs a
# real Prometheus, and `make monitor` starts one (config/monitoring/). Check for both; where
# apt-get can install them (root or passwordless sudo; Debian 12 ships Prometheus 2.42 with
# promtool), do so; otherwise stop with what to do. tmux too: tests/test_top.py checks
# `tsctl top`'s layout in a real 80-column terminal.
set -euo pipefail
# shellcheck source=devtools/apt.sh
. "$(dirname "$0")/apt.sh"

has_prometheus() {
  command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 &&
    command -v tmux >/dev/null 2>&1
}

if has_prometheus; then
  exit 0
fi

echo "prometheus/promtool/tmux not found: config/monitoring's rule tests, \`make monitor\` and tsctl top's terminal test need them." >&2
if can_apt; then
  echo "Installing Prometheus with apt-get..." >&2
  apt_update
  # --no-install-recommends: not the node exporter and the web console libraries.
  apt_install --no-install-recommends \
    prometheus tmux || true
  hash -r
fi
if ! has_prometheus; then
  cat >&2 <<'MSG'
error: Prometheus 2.x (the `prometheus` server and `promtool`) and tmux are required by the
monitoring tests (tests/test_monitoring.py, tests/test_top.py) and `make monitor`, and could not
be installed automatically.
  Debian/Ubuntu:  sudo apt-get install -y prometheus tmux
  Fedora/RHEL:    sudo dnf install -y golang-github-prometheus
  Any OS:         https://prometheus.io/download/ (put prometheus and promtool on PATH)
  macOS:          brew install prometheus
Then make sure `promtool --version` works, and re-run the make command.
MSG
  exit 1
fi
echo "Prometheus is ready: $(prometheus --version 2>&1 | head -n1)." >&2
