#!/usr/bin/env bash
# Make sure OpenSSH's sshd and client are installed, for the SSH executor's tests and bench: the
# tests start their own sshd on loopback ports and in network namespaces (tests/ssh_hosts.py);
# nothing is started here. A no-op when both are installed; as root, installs Debian's
# openssh-server (about 10 s) when they are not. Facts behind it: ../shared/notes/remote-hosts.md.
set -euo pipefail

if [ -x /usr/sbin/sshd ] && command -v ssh >/dev/null && command -v ssh-keygen >/dev/null; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "ensure-sshd: sshd is not installed and this is not root: install openssh-server, or the SSH tests are skipped" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q openssh-server openssh-client >/dev/null 2>&1 || {
  apt-get update -q >/dev/null 2>&1
  apt-get install -y -q openssh-server openssh-client >/dev/null
}
mkdir -p /run/sshd
echo "ensure-sshd: $(/usr/sbin/sshd -V 2>&1 | head -1) installed"
