#!/bin/bash
# Install the S3-compatible servers the S3 tests start on 127.0.0.1: Ceph RGW (Debian's radosgw with a
# one-node mon/osd) and moto's server mode. Idempotent: does nothing that is already there.
set -euo pipefail
PACKAGES=(radosgw ceph-mon ceph-osd ceph-common)
missing=()
for package in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
python -c "import moto.server, flask" 2>/dev/null || python -m pip install -q "moto[server]>=5.0"
