#!/usr/bin/env bash
# Prepare, on a machine with network, everything the GPU benchmarks need on a GPU machine without it.
# Run from the repository root:
#   bash bench/gpu/prepare.sh [wheels] [model] [corpus] [poppler] [tesseract]   (default: all)
# Writes (ignored by git):
#   .whl/partN/chunkN   every wheel installed for CPython 3.12 x86-64 (pip --target layout) as one tar.xz
#                       stream cut into <= ${CHUNK:-50M} parts; the last part also holds stream.sha256
#   .whl/wheels.txt     every wheel with its size
#   bench/gpu/deps-ocrwatch.txt   (tracked) the pins of ocrwatch's runtime dependencies the image lacks, as pip
#                       resolved them from pyproject.toml (wheelset.py); a diff means the package's needs changed
#   .gpu/dsocr2/        random-weight DeepSeek-OCR-2 replica (config + synthetic tokenizer, make_model.py)
#   .gpu/dsocr1/        the same for DeepSeek-OCR (make_model.py --ocr1)
#   .gpu/corpus/        docs/ (every readable PDF of $CORPUS), doc300.pdf (>= 300 pages)
#   .gpu/poppler/       this machine's pdftoppm, pdfinfo, pdfunite and their libraries (bundle_poppler.sh)
#   .gpu/tesseract/     bundle.tar.xz: this machine's tesseract, its libraries and the osd and eng data
#                       (bundle_tesseract.sh); env.sh unpacks it on a GPU machine without tesseract
# Knobs: VLLM (the vLLM version, 0.26.0), CORPUS (a folder of PDFs; default $OCRWATCH_CORPUS or ../shared/corpus),
# W (download cache), CHUNK (part size), XZ_LEVEL, XZ_THREADS.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
HERE=bench/gpu
VLLM=${VLLM:-0.26.0}
W=${W:-/tmp/gpuwheels}
CORPUS=${CORPUS:-${OCRWATCH_CORPUS:-../shared/corpus}}
steps=${*:-wheels model corpus poppler tesseract}

pages() { pdfinfo "$1" 2>/dev/null | awk '/^Pages:/{print $2}'; }

wheels() {
  local plat="" n
  for n in 2_17 2_24 2_26 2_27 2_28 2_31 2_34 2_35; do plat+=" --platform manylinux_${n}_x86_64"; done
  plat+=" --platform manylinux2014_x86_64 --platform manylinux1_x86_64"
  local get="python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp $plat"
  local dl="$get --no-deps -d $W"
  mkdir -p "$W"
  ls $W/vllm-$VLLM-*.whl >/dev/null 2>&1 || $dl "vllm==$VLLM"
  $dl -r $HERE/deps-vllm.txt
  # ocrwatch's own needs, derived from pyproject.toml (dependencies and the vllm extra): pip resolves them
  # for the device beside vLLM's pins, and what the image lacks becomes deps-ocrwatch.txt (wheelset.py).
  python3 $HERE/wheelset.py requirements > $W/ocrwatch-requirements.txt
  rm -rf $W/resolved; $get -d $W/resolved -c $HERE/deps-vllm.txt -r $W/ocrwatch-requirements.txt
  python3 $HERE/wheelset.py lock $W/resolved > $HERE/deps-ocrwatch.txt
  $dl -r $HERE/deps-ocrwatch.txt
  $dl -r $HERE/deps-bench.txt
  python3 $HERE/wheelset.py check $W  # a runtime dependency neither packed nor on the image stops here
  # Slim vLLM: drop the FA2 kernels (Hopper uses FA3), the Rust frontend binary and the deep_gemm builds for
  # other Pythons: 304 MB -> ~156 MB. The listing goes to a file first: `unzip | grep -q` under pipefail is
  # always false (SIGPIPE).
  local v; v=$(ls $W/vllm-$VLLM-*.whl)
  if unzip -Z1 "$v" > /tmp/vllm-wheel-list.txt && grep -q _vllm_fa2_C /tmp/vllm-wheel-list.txt; then
    zip -q -d "$v" 'vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so' 'vllm/vllm-rs' \
      'vllm/third_party/deep_gemm/_C.cpython-31[0134]-*'
    local tmp; tmp=$(mktemp -d); (cd $tmp && unzip -q -o "$v" "vllm-$VLLM.dist-info/RECORD" &&
      grep -v -E '_vllm_fa2_C|^vllm/vllm-rs,|deep_gemm/_C.cpython-31[0134]' "vllm-$VLLM.dist-info/RECORD" > R &&
      mv R "vllm-$VLLM.dist-info/RECORD" && zip -q "$v" "vllm-$VLLM.dist-info/RECORD"); rm -rf $tmp
  fi
  # Exactly one version of each project: two stop the whole install.
  local dups; dups=$(ls $W/*.whl | xargs -n1 basename | sed -E 's/-[0-9].*//' | tr 'A-Z-' 'a-z_' | sort | uniq -d)
  [ -z "$dups" ] || { echo "duplicate wheels in $W: $dups" >&2; exit 1; }
  # Install every wheel here for CPython 3.12 x86-64 into a staging folder (what `pip install --target` does
  # there), drop what a Hopper GPU never loads (the Blackwell-only fmha_sm100), and ship the tree as one xz
  # stream: smaller than the wheels, and nothing to build or resolve on the GPU machine.
  local stage=${STAGE:-/tmp/ocrwatch-gpu-site}
  rm -rf "$stage"
  python3 -m pip install -q --target "$stage" --no-deps --no-compile --no-index --only-binary=:all: \
    --python-version 3.12 --implementation cp $plat --platform manylinux_2_5_x86_64 $W/*.whl
  rm -rf "$stage"/vllm/third_party/fmha_sm100 "$stage"/bin
  rm -rf .whl; mkdir -p .whl
  tar cf - -C "$stage" . | xz -T${XZ_THREADS:-0} -${XZ_LEVEL:-9} | split -b ${CHUNK:-50M} -d -a 1 - .whl/chunk
  local f i
  for f in .whl/chunk*; do i=${f##*chunk}; mkdir -p .whl/part$i; mv "$f" .whl/part$i/; done
  (cd "$W" && ls -l *.whl) | awk '{print $5, $9}' | sort -n -r > .whl/wheels.txt
  (cd .whl && cat part*/chunk* | sha256sum | cut -d' ' -f1 > stream.sha256)
  cp .whl/stream.sha256 "$(ls -d .whl/part* | sort -V | tail -1)"/
  du -sh .whl/part*
}

model() {
  local py=python3
  if ! $py -c 'import tokenizers' 2>/dev/null; then
    [ -x /tmp/ocrwatch-prep-venv/bin/python ] || { python3 -m venv /tmp/ocrwatch-prep-venv &&
      /tmp/ocrwatch-prep-venv/bin/pip install -q tokenizers==0.23.2; }
    py=/tmp/ocrwatch-prep-venv/bin/python
  fi
  rm -rf .gpu/dsocr2 .gpu/dsocr1; $py $HERE/make_model.py .gpu/dsocr2; $py $HERE/make_model.py .gpu/dsocr1 --ocr1
}

corpus() {
  rm -rf .gpu/corpus; mkdir -p .gpu/corpus/docs
  local f n
  for f in "$CORPUS"/*.pdf; do  # every PDF that has pages and opens without a password
    n=$(pages "$f") || true
    [ -n "${n:-}" ] && [ "$n" -gt 0 ] && cp "$f" .gpu/corpus/docs/
  done
  ls .gpu/corpus/docs/*.pdf >/dev/null 2>&1 || { echo "no readable PDF in $CORPUS" >&2; exit 1; }
  # doc300.pdf: the corpus's PDFs joined, again and again, until >= 300 pages. (The one-page documents e2e.py
  # drops alone and as the urgent page are made at run time, fresh_page.py: pages no phase has seen.)
  local big=() total=0
  while [ $total -lt 300 ]; do
    for f in .gpu/corpus/docs/*.pdf; do big+=("$f"); total=$(( total + $(pages "$f") )); [ $total -ge 300 ] && break; done
  done
  pdfunite "${big[@]}" .gpu/corpus/doc300.pdf
  for f in .gpu/corpus/docs/*.pdf .gpu/corpus/doc300.pdf; do echo "$(pages "$f") $(basename "$f")"; done \
    > .gpu/corpus/pages.txt
  awk '!/doc300/ {s+=$1; n++} END {print "corpus:", n, "PDFs,", s, "pages"}' .gpu/corpus/pages.txt
}

poppler() {
  # ocrwatch renders PDFs with pdftoppm/pdfinfo; a GPU image may lack poppler-utils. env.sh puts the bundle
  # on PATH there when the machine has no pdftoppm of its own.
  bash $HERE/bundle_poppler.sh .gpu/poppler
}

tesseract_bundle() {
  # [render] rotate_pages (on by default) needs tesseract and its osd data; a GPU image may lack them.
  bash $HERE/bundle_tesseract.sh .gpu/tesseract
}

for step in $steps; do
  case $step in
    wheels|model|corpus|poppler) $step ;;
    tesseract) tesseract_bundle ;;
    *) echo "unknown step $step (wheels, model, corpus, poppler, tesseract)" >&2; exit 2 ;;
  esac
done
