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
# Several GPUs: NVLink multicast off (NCCL NVLS, symmetric memory, NVSHMEM), which shared or virtualised hosts
# may not allow.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
