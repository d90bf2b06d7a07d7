#!/usr/bin/env bash
# tests/test_pages.py opens the result pages (tsctl ... --html) in a headless Chromium, driven
# by the playwright package with Debian's browser (Playwright's own browser download is not
# used). Check for it; where apt-get can install it (root or passwordless sudo), do so;
# otherwise say so and go on: only those browser tests are skipped, with this reason.
set -euo pipefail
# shellcheck source=devtools/apt.sh
. "$(dirname "$0")/apt.sh"

has_chromium() {
  command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1
}

if has_chromium; then
  exit 0
fi

echo "Chromium not found: tests/test_pages.py looks at the result pages in it (headless)." >&2
if can_apt; then
  echo "Installing chromium with apt-get..." >&2
  apt_update
  apt_install chromium || true
  hash -r
fi
if ! has_chromium; then
  cat >&2 <<'MSG'
warning: Chromium could not be installed automatically; the browser tests of tests/test_pages.py
will be skipped (and `make docs-screenshots` cannot run). To install it:
  Debian:         sudo apt-get install -y chromium
  Ubuntu:         sudo snap install chromium   (Ubuntu's apt package only installs the snap)
  Fedora/RHEL:    sudo dnf install -y chromium
Any Chromium on PATH as `chromium` or `chromium-browser` will do.
MSG
  exit 0
fi
echo "Chromium is ready: $( (chromium --version || chromium-browser --version) 2>/dev/null | head -n1)." >&2
