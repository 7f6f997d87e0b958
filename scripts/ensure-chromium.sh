#!/usr/bin/env bash
# The dashboard tests drive Debian's chromium through Playwright (no browser download).
set -euo pipefail
command -v chromium >/dev/null && exit 0
echo "chromium not found: installing Debian's chromium" >&2
if [ "$(id -u)" -eq 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium
else sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; fi
