#!/usr/bin/env bash
# The README's test command: installs what the suite needs on a fresh Debian machine, then runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
if ! command -v pdftoppm >/dev/null || ! command -v tesseract >/dev/null || ! command -v qpdf >/dev/null \
    || ! tesseract --list-langs 2>/dev/null | grep -x deu >/dev/null; then
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends poppler-utils qpdf tesseract-ocr tesseract-ocr-eng tesseract-ocr-deu >/dev/null
fi
if [ -x tests/install_s3_servers.sh ] || [ -f tests/install_s3_servers.sh ]; then
  bash tests/install_s3_servers.sh
fi
python3 -m pip install -q -e '.[test]'
set +e
# The suite mostly waits (daemons, settle times, sleeps), so more workers than cores pay.
# A later -n or --dist in "$@" wins (-n 0: one process, as before).
python3 -m pytest -q -ra -n "${OCRWATCH_TEST_WORKERS:-4}" --dist loadgroup "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing on purpose" >&2
  exit 1
fi
exit "$rc"
