#!/usr/bin/env bash
# TorchServe's frontend is a Java program and needs Java 17 or newer. Check for it; where
# apt-get can install it (root or passwordless sudo), do so; otherwise stop with what to do.
# Then jlink and jdeps (a JDK's): `make gpu-stage` makes the Java runtime a bare GPU host gets
# with them (buildsteps/stage.py); without them it, and its tests, say so, and nothing else stops.
set -euo pipefail
# shellcheck source=devtools/apt.sh
. "$(dirname "$0")/apt.sh"

java_major() {
  command -v java >/dev/null 2>&1 || { echo 0; return; }
  # `java -version` prints e.g.: openjdk version "17.0.15" 2025-04-15  (or "1.8.0_392")
  local v
  v=$(java -version 2>&1 | sed -n 's/.*version "\([0-9][0-9.]*\).*/\1/p' | head -n1)
  v=${v#1.}
  echo "${v%%.*}"
}

jdk_tools() {
  if command -v jlink >/dev/null 2>&1 && command -v jdeps >/dev/null 2>&1; then return 0; fi
  if can_apt; then
    echo "Installing a JDK (jlink, jdeps: make gpu-stage) with apt-get..." >&2
    apt_update
    apt_install openjdk-17-jdk-headless && hash -r && return 0
  fi
  echo "warning: no jlink/jdeps (a JDK 17+: apt-get install -y openjdk-17-jdk-headless):" \
    "make gpu-stage and tests/test_stage.py's Java tests cannot run" >&2
}

major=$(java_major)
if [ "${major:-0}" -ge 17 ]; then
  jdk_tools
  exit 0
fi

echo "TorchServe needs Java 17+; found: $( [ "$major" = 0 ] && echo none || echo "Java $major")." >&2
if can_apt; then
  echo "Installing a Java runtime with apt-get..." >&2
  apt_update
  apt_install openjdk-17-jre-headless \
    || apt_install openjdk-21-jre-headless
  hash -r
  major=$(java_major)
fi
if [ "${major:-0}" -lt 17 ]; then
  cat >&2 <<'MSG'
error: Java 17 or newer is required by TorchServe and could not be installed automatically.
  Debian/Ubuntu:  sudo apt-get install -y openjdk-17-jre-headless
  Fedora/RHEL:    sudo dnf install -y java-17-openjdk-headless
  macOS:          brew install openjdk@17
Then make sure `java -version` reports 17 or newer, and re-run the make command.
MSG
  exit 1
fi
echo "Java $major is ready." >&2
jdk_tools
