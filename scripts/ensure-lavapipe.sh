#!/usr/bin/env bash
# The WGSL backend's tests run on Mesa's lavapipe, a Vulkan driver on the CPU (no GPU needed).
set -euo pipefail
ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1 && exit 0
echo "Mesa's lavapipe Vulkan driver not found: installing Debian's mesa-vulkan-drivers" >&2
if [ "$(id -u)" -eq 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mesa-vulkan-drivers
else sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mesa-vulkan-drivers; fi
