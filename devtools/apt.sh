# Sourced by devtools/ensure_*.sh: apt-get where this user may run it (root, or passwordless
# sudo: make must never stop at a password prompt).
APT_SUDO=""
[ "$(id -u)" -eq 0 ] || APT_SUDO="sudo -n"

# True when apt-get exists and may be run without a prompt.
can_apt() {
  command -v apt-get >/dev/null 2>&1 && { [ -z "$APT_SUDO" ] || sudo -n true 2>/dev/null; }
}

apt_update() {
  $APT_SUDO apt-get update -qq
}

# apt_install [apt-get options] PKG...: quietly, no prompts; apt-get's exit status.
apt_install() {
  $APT_SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
}
