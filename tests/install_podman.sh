#!/bin/bash
# Install what tests/integration/test_container.py needs to build and run the container image with
# no registry: podman and buildah (build, run), runc (crun refuses some cgroup layouts), mmdebstrap
# (the Debian base image, made from the machine's own apt sources). Idempotent: installs only what
# is missing.
set -euo pipefail
PACKAGES=(podman buildah mmdebstrap runc)
missing=()
for package in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" \
        || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
        "${missing[@]}"
fi
