# Environment for every device-side script (source it from the repository root on the device).
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
  VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export VLLM_CACHE_ROOT=${VLLM_CACHE_ROOT:-/tmp/ocw-vllm-cache}
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/ocw-inductor-cache}
mkdir -p /tmp/ocw-results
# A machine without poppler-utils: use the bundle prepare.sh made (bench/gpu/bundle_poppler.sh).
if ! command -v pdftoppm >/dev/null && [ -x "$PWD/.gpu/poppler/bin/pdftoppm" ]; then
  export PATH=$PWD/.gpu/poppler/bin:$PATH
fi
# A machine without tesseract ([render] rotate_pages, on by default, needs it and its osd data): unpack the
# bundle prepare.sh made (bench/gpu/bundle_tesseract.sh) once into $TESSERACT_HOME and put it on PATH.
TESSERACT_HOME=${TESSERACT_HOME:-/tmp/ocw-tesseract}
if ! command -v tesseract >/dev/null && [ -f "$PWD/.gpu/tesseract/bundle.tar.xz" ]; then
  if [ ! -x "$TESSERACT_HOME/bin/tesseract" ]; then
    rm -rf "$TESSERACT_HOME" "$TESSERACT_HOME.part"; mkdir -p "$TESSERACT_HOME.part"
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="tar")' \
      "$PWD/.gpu/tesseract/bundle.tar.xz" "$TESSERACT_HOME.part" && mv "$TESSERACT_HOME.part" "$TESSERACT_HOME"
  fi
  export PATH=$TESSERACT_HOME/bin:$PATH
fi
# Several GPUs: NVLink multicast off (NCCL NVLS, symmetric memory, NVSHMEM), which shared or virtualised hosts
# may not allow.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
