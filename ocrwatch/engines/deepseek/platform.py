"""What the engine chooses from the platform vLLM runs on: a CUDA GPU or the host's CPU. Pure
functions of the configuration and a ``Platform`` (read by ``engine._Runtime`` from the installed
vLLM), so every choice is tested without vLLM.

- vLLM's V2 model runner only on a CUDA GPU: it needs Triton, and vLLM's CPU build refuses it
  (``ValidationError: Model Runner V2 requires Triton``).
- ``enforce_eager`` unset: eager on the CPU (vLLM's CPU backend otherwise traces the model with
  torch.compile at every start, minutes on a small host), CUDA graphs on a GPU.
- The warm-up page: the tiled path on a GPU, one tile on the CPU (``warmup_size``).
- The sizes from the host's memory where there is no GPU (``sizing.resolve_host``): the GPU rule fed
  the host's memory made vLLM profile 39 images of the largest size at once, and the engine core was
  killed for memory at 22 GB."""

from __future__ import annotations

from dataclasses import dataclass

from ocrwatch.engines.deepseek import sizing
from ocrwatch.engines.deepseek.geometry import VisionGeometry
from ocrwatch.engines.deepseek.options import VllmConfig

CUDA = "cuda"
CPU = "cpu"


@dataclass(frozen=True)
class Platform:
    device: str
    """vLLM's ``current_platform.device_type``: ``cuda``, ``cpu``, or empty where it found none."""
    memory_bytes: int | None
    """One GPU's total memory; on the CPU the host's available memory; None if unknown."""
    devices: int = 0
    """CUDA devices visible (0 on the CPU)."""


def v2_runner(cfg: VllmConfig, platform: Platform, *, host_processor: bool) -> bool:
    """Ask for vLLM's V2 model runner (``arguments.engine_env`` says why it pays): one CUDA GPU and
    no logits processor on the host (``host_processor``), which the V2 runner refuses."""
    return (
        platform.device == CUDA
        and cfg.tensor_parallel_size == 1
        and cfg.data_parallel_size == 1
        and not host_processor
    )


def enforce_eager(cfg: VllmConfig, platform: Platform) -> bool:
    """The config's choice, else eager everywhere but on a CUDA GPU."""
    return cfg.enforce_eager if cfg.enforce_eager is not None else platform.device != CUDA


def warmup_size(vision: VisionGeometry, platform: Platform | None) -> tuple[int, int]:
    """The warm-up page's size. On a GPU (or before the platform is known) 2 × 3 tiles, so the
    first real page pays none of the tile path's first-use costs (kernels compiled, CUDA graphs
    captured); on the CPU, in eager mode, there are none to pay, and the tiled page's six tiles
    through the vision encoder cost a minute of a 2-core host at every engine start: one tile
    (only the global view is encoded)."""
    tile = vision.tile_size
    if platform is None or platform.device == CUDA:
        return 2 * tile, 3 * tile
    return tile, tile


def describe(
    cfg: VllmConfig, platform: Platform, sizes: sizing.Sizing, *, host_processor: bool
) -> str:
    """One line for ``ocrwatch check`` and the start: the platform and what the engine makes of
    it."""
    memory = (
        "memory unknown"
        if platform.memory_bytes is None
        else f"{platform.memory_bytes / sizing.GIB:.1f} GiB"
        + (" available on the host" if platform.device != CUDA else " per GPU")
    )
    where = f"{platform.devices} CUDA device(s)" if platform.device == CUDA else "the host's CPU"
    parts = [
        f"{platform.device} ({where}, {memory})",
        "eager" if enforce_eager(cfg, platform) else "CUDA graphs / torch.compile",
        "model runner "
        + ("V2" if v2_runner(cfg, platform, host_processor=host_processor) else "chosen by vLLM"),
        f"{sizes.max_num_seqs} sequences, {sizes.max_num_batched_tokens} batched tokens "
        f"({sizes.source})",
    ]
    if sizes.kv_cache_bytes is not None:
        parts.append(f"{sizes.kv_cache_bytes / sizing.GIB:.2f} GiB KV cache")
    return ", ".join(parts)
