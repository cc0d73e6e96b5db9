#!/usr/bin/env bash
# Install Debian's chromium for tests/test_report_browser.py (the report opened in a real
# headless browser). Never fails CI: without a browser that test skips with a message.
set -u

if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
   || command -v google-chrome >/dev/null 2>&1; then
  echo "install-browser: a chromium is already installed"
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-browser: no apt-get here; the browser test will skip"
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO="sudo -n"
  else
    echo "install-browser: not root and no password-less sudo; the browser test will skip"
    exit 0
  fi
fi
export DEBIAN_FRONTEND=noninteractive
if $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q chromium >/dev/null; then
  echo "install-browser: $(chromium --version 2>/dev/null || echo chromium installed)"
else
  echo "install-browser: could not install chromium; the browser test will skip"
fi
exit 0
