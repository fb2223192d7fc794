#!/usr/bin/env bash
# On the device, in the repository root, after the earlier calls copied .whl/partN/chunk* to /tmp/parts:
# unpack the site tree (pip --target layout, made by prepare.sh) into /tmp/site and make ocrwatch's engines and
# vLLM plugin discoverable (entry points).  Idempotent.  Then: source bench/gpu/env.sh
set -euo pipefail
if [ ! -f /tmp/site/.done ]; then
  mkdir -p /tmp/parts; for f in .whl/part*/*; do [ -f "$f" ] && cp -n "$f" /tmp/parts/; done
  ls -l /tmp/parts
  if [ -f /tmp/parts/stream.sha256 ]; then
    got=$(cat /tmp/parts/chunk* | sha256sum | cut -d' ' -f1)
    [ "$got" = "$(cat /tmp/parts/stream.sha256)" ] || { echo "wheel stream checksum mismatch: $got" >&2; exit 1; }
  fi
  mkdir -p /tmp/site
  t0=$(date +%s)
  if command -v xz >/dev/null; then
    cat /tmp/parts/chunk* | xz -dc -T0 | tar xf - -C /tmp/site
  else
    cat /tmp/parts/chunk* | python3 -c "import sys,tarfile; tarfile.open(fileobj=sys.stdin.buffer, mode='r|xz').extractall('/tmp/site')"
  fi
  echo "unpacked in $(( $(date +%s) - t0 )) s"
  touch /tmp/site/.done
fi
# ocrwatch itself: its engines and the vLLM plugin are found through entry points, so ocrwatch needs dist-info.
if ! PYTHONPATH=/tmp/site python3 -c "from importlib.metadata import entry_points as e; import sys; sys.exit(0 if any(p.name=='ocrwatch_deepseek_ocr2' for p in e(group='vllm.general_plugins')) else 1)" 2>/dev/null; then
  if ! PYTHONPATH=/tmp/site python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/tmp/ocw-pip.log 2>&1; then
    echo "pip install -e . failed (see /tmp/ocw-pip.log); writing ocrwatch dist-info from pyproject.toml" >&2
    tail -5 /tmp/ocw-pip.log >&2
    python3 - <<'PY'
import pathlib, tomllib
project = tomllib.loads(pathlib.Path("pyproject.toml").read_text())["project"]
groups = {"console_scripts": project.get("scripts", {}), **project.get("entry-points", {})}
d = pathlib.Path(f"/tmp/site/ocrwatch-{project['version']}.dist-info")
d.mkdir(parents=True, exist_ok=True)
(d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: ocrwatch\nVersion: {project['version']}\n")
(d / "entry_points.txt").write_text("".join(
    f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in points.items()) + "\n"
    for group, points in groups.items()))
PY
  fi
fi
source "$(dirname "$0")/env.sh"
python3 - <<'PY'
import importlib.metadata as md, torch, vllm
eps = [p.value for p in md.entry_points(group="vllm.general_plugins")]
print("vllm", vllm.__version__, "| torch", torch.__version__, "| plugins", eps)
import ocrwatch, structlog, pydantic, tenacity, watchdog, aiohttp, pikepdf, boto3  # the wheel set did miss one
print("ocrwatch", getattr(ocrwatch, "__version__", "?"), "from", ocrwatch.__file__,
      "| engines", sorted(md.entry_points(group="ocrwatch.engines").names))
PY
