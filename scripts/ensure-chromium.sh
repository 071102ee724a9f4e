#!/usr/bin/env bash
# Make sure Debian's Chromium is installed, for the dashboard's browser tests (Playwright drives
# /usr/bin/chromium; no browser is ever downloaded). A no-op when it is installed; as root,
# installs Debian's chromium (about 25 s) when it is not. Facts behind it: ../shared/notes/browser.md.
set -euo pipefail

if [ -x /usr/bin/chromium ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "ensure-chromium: chromium is not installed and this is not root: install it, or the browser tests are skipped" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q chromium >/dev/null 2>&1 || {
  apt-get update -q >/dev/null 2>&1
  apt-get install -y -q chromium >/dev/null
}
echo "ensure-chromium: $(/usr/bin/chromium --version 2>/dev/null | head -1) installed"
