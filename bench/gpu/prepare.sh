#!/usr/bin/env bash
# Prepare, on the dev machine, everything the GPU benchmark needs on the lent H200.
# Run from the repository root:   bash bench/gpu/prepare.sh
# Writes (all ignored through .git/info/exclude):
#   .whl/partN/chunkN   the wheels installed for CPython 3.12 (pip --target) as one tar.xz
#                       stream cut into <= ${CHUNK:-50M} parts (carry one part per `run` call)
#   .whl/wheels.txt     every wheel with its size
#   .gpu/dsocr2/        random-weight DeepSeek-OCR-2 replica (config + synthetic tokenizer)
#   .gpu/corpus/        the PDFs the benchmarks render (copied from ../shared/corpus)
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
HERE=bench/gpu
VLLM=${VLLM:-0.26.0}
W=${W:-/tmp/gpuwheels}              # download cache, outside the repo
SHARED=${SHARED:-../shared}
for p in /.whl/ /.gpu/; do grep -qxF "$p" .git/info/exclude || echo "$p" >> .git/info/exclude; done

# 1. wheels ------------------------------------------------------------------
PLAT=""; for n in 2_17 2_24 2_26 2_27 2_28 2_31 2_34 2_35; do PLAT+=" --platform manylinux_${n}_x86_64"; done
PLAT+=" --platform manylinux2014_x86_64 --platform manylinux1_x86_64"
DL="python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLAT -d $W"
mkdir -p "$W"
if [ -f /tmp/vllmsrc/w026/vllm-$VLLM-cp38-abi3-manylinux_2_28_x86_64.whl ] && [ ! -f $W/vllm-$VLLM-cp38-abi3-manylinux_2_28_x86_64.whl ]; then
  cp /tmp/vllmsrc/w026/vllm-$VLLM-cp38-abi3-manylinux_2_28_x86_64.whl $W/   # same file PyPI serves
fi
[ -f $W/vllm-$VLLM-cp38-abi3-manylinux_2_28_x86_64.whl ] || $DL "vllm==$VLLM"
$DL -r $HERE/deps-vllm.txt
$DL -r $HERE/deps-ocrwatch.txt
# Slim vLLM: drop the FA2 kernels (Hopper uses FA3), the Rust frontend binary and the
# deep_gemm builds for other Pythons: 304 MB -> ~156 MB.
V=$(ls $W/vllm-$VLLM-*.whl)
if unzip -Z1 "$V" > /tmp/vllm-wheel-list.txt && grep -q _vllm_fa2_C /tmp/vllm-wheel-list.txt; then
  zip -q -d "$V" 'vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so' 'vllm/vllm-rs' \
    'vllm/third_party/deep_gemm/_C.cpython-31[0134]-*'
  tmp=$(mktemp -d); (cd $tmp && unzip -q -o "$V" "vllm-$VLLM.dist-info/RECORD" &&
    grep -v -E '_vllm_fa2_C|^vllm/vllm-rs,|deep_gemm/_C.cpython-31[0134]' "vllm-$VLLM.dist-info/RECORD" > R &&
    mv R "vllm-$VLLM.dist-info/RECORD" && zip -q "$V" "vllm-$VLLM.dist-info/RECORD"); rm -rf $tmp
fi
# Keep exactly one version of each project (two stop the whole install).
dups=$(ls $W/*.whl | xargs -n1 basename | sed -E 's/-[0-9].*//' | tr 'A-Z-' 'a-z_' | sort | uniq -d)
[ -z "$dups" ] || { echo "duplicate wheels in $W: $dups" >&2; exit 1; }
# Install every wheel here, for CPython 3.12 on x86-64, into a staging folder (exactly what
# `pip install --target` would do there), drop what the H200 never loads (Blackwell-only
# fmha_sm100), and ship that tree as one xz stream: 228 MB of wheels -> ~160 MB.
STAGE=${STAGE:-/tmp/ocrwatch-gpu-site}
rm -rf "$STAGE"
python3 -m pip install -q --target "$STAGE" --no-deps --no-compile --no-index --only-binary=:all: \
  --python-version 3.12 --implementation cp $PLAT --platform manylinux_2_5_x86_64 $W/*.whl
rm -rf "$STAGE"/vllm/third_party/fmha_sm100 "$STAGE"/bin
rm -rf .whl; mkdir -p .whl
tar cf - -C "$STAGE" . | xz -T${XZ_THREADS:-0} -${XZ_LEVEL:-9} | split -b ${CHUNK:-50M} -d -a 1 - .whl/chunk
for f in .whl/chunk*; do i=${f##*chunk}; mkdir -p .whl/part$i; mv "$f" .whl/part$i/; done
(cd "$W" && ls -l *.whl) | awk '{print $5, $9}' | sort -n -r > .whl/wheels.txt
(cd .whl && cat part*/chunk* | sha256sum | cut -d' ' -f1 > stream.sha256)
last=$(ls -d .whl/part* | sort -V | tail -1); cp .whl/stream.sha256 "$last"/

# 2. model directory ---------------------------------------------------------
PY=python3
if ! $PY -c 'import tokenizers' 2>/dev/null; then
  [ -x /tmp/ocrwatch-prep-venv/bin/python ] || { python3 -m venv /tmp/ocrwatch-prep-venv &&
    /tmp/ocrwatch-prep-venv/bin/pip install -q tokenizers==0.23.2; }
  PY=/tmp/ocrwatch-prep-venv/bin/python
fi
rm -rf .gpu/dsocr2; $PY $HERE/make_model.py .gpu/dsocr2

# 3. corpus ------------------------------------------------------------------
# Every PDF of the shared corpus that has pages and opens without a password,
# plus doc300.pdf (>= 300 pages, for the latency test) built with pdfunite.
rm -rf .gpu/corpus; mkdir -p .gpu/corpus/docs
for f in "$SHARED"/corpus/*.pdf; do
  n=$(pdfinfo "$f" 2>/dev/null | awk '/^Pages:/{print $2}') || true
  [ -n "${n:-}" ] && [ "$n" -gt 0 ] && cp "$f" .gpu/corpus/docs/
done
G="$SHARED/corpus/GeoTopo-komprimiert.pdf"; T="$SHARED/corpus/tracemonkey.pdf"
pdfunite "$G" "$G" "$T" "$T" "$T" "$T" "$T" .gpu/corpus/doc300.pdf
cp "$SHARED/corpus/google-doc-document.pdf" .gpu/corpus/one.pdf
for f in .gpu/corpus/docs/*.pdf .gpu/corpus/doc300.pdf; do
  echo "$(pdfinfo "$f" | awk '/^Pages:/{print $2}') $(basename "$f")"; done > .gpu/corpus/pages.txt

# 4. poppler for the device ------------------------------------------------------
# The device image has no pdftoppm/pdfinfo (seen 2026-11-29), and ocrwatch renders PDFs with them.
# Carry this machine's (Debian 12, poppler 22.12) binaries with the libraries they load, minus the C/C++
# runtime the device has newer versions of, behind wrappers that set LD_LIBRARY_PATH for them alone;
# plus DejaVu fonts and a fonts.conf for text in non-embedded fonts.  env.sh puts .gpu/poppler/bin on PATH.
bash $HERE/bundle_poppler.sh .gpu/poppler

du -sh .whl/part* .gpu/dsocr2 .gpu/corpus .gpu/poppler
awk '{s+=$1} END {print "docs pages:", s}' <(grep -v doc300 .gpu/corpus/pages.txt)
