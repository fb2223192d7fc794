"""The fast encoder's CUDA-graph dispatch (``ViewGraphs``): which captured batch size a stack of
views replays, how it is padded and split. CUDA graphs need a GPU, so the graph is replaced by a
replay that recomputes its captured function on the static buffers, as a real replay does;
bench/gpu/encoder_check.py checks the captured graphs against vLLM's encoder on the GPU. Needs torch
(the ``vllm`` extra)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
fast = pytest.importorskip("ocrwatch.engines.deepseek.encoder")


def encode(model: Any, views: Any) -> Any:
    """A per-view function of the pixels, like the encoder (no view sees another)."""
    return views.sum(dim=(2, 3))[:, None, :] * torch.arange(1, 5, dtype=views.dtype)[None, :, None]


class Replay:
    def __init__(self, static_in: Any) -> None:
        self.static_in = static_in
        self.static_out = encode(None, static_in)
        self.replays = 0

    def replay(self) -> None:
        self.static_out.copy_(encode(None, self.static_in))
        self.replays += 1


@pytest.fixture
def graphs(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(fast, "encode_chunk", encode)
    vg = fast.ViewGraphs(model=None, sizes={8: (2, 4)})
    captured: list[tuple[int, int]] = []

    def capture_side(side: int, sizes: tuple[int, ...], dtype: Any, device: Any) -> None:
        for size in sizes:
            replay = Replay(torch.zeros((size, 3, side, side), dtype=dtype, device=device))
            vg.graphs[(side, size)] = (replay, replay.static_in, replay.static_out)
            captured.append((side, size))

    monkeypatch.setattr(vg, "_capture_side", capture_side)
    vg.captured = captured
    return vg


def test_a_batch_replays_the_smallest_graph_that_holds_it(graphs: Any) -> None:
    views = torch.rand(3, 3, 8, 8)
    out = graphs(views)
    assert torch.equal(out, encode(None, views))
    # every size of the side, the first time the side is seen
    assert graphs.captured == [(8, 2), (8, 4)]
    assert graphs.graphs[(8, 4)][0].replays == 1 and graphs.graphs[(8, 2)][0].replays == 0


def test_the_padding_is_blank_and_never_leaks_into_the_next_batch(graphs: Any) -> None:
    graphs(torch.rand(4, 3, 8, 8) + 1)
    views = torch.rand(3, 3, 8, 8)
    out = graphs(views)
    assert torch.equal(out, encode(None, views))
    assert torch.count_nonzero(graphs.graphs[(8, 4)][1][3]) == 0


def test_a_batch_larger_than_the_largest_graph_runs_as_several(graphs: Any) -> None:
    views = torch.rand(9, 3, 8, 8)
    out = graphs(views)
    assert torch.equal(out, encode(None, views))
    assert graphs.graphs[(8, 4)][0].replays == 2 and graphs.graphs[(8, 2)][0].replays == 1


def test_the_output_is_a_copy_the_next_replay_cannot_overwrite(graphs: Any) -> None:
    first = graphs(torch.ones(2, 3, 8, 8))
    kept = first.clone()
    graphs(torch.rand(2, 3, 8, 8))
    assert torch.equal(first, kept)


def test_a_view_size_without_graphs_runs_eagerly(graphs: Any) -> None:
    views = torch.rand(2, 3, 6, 6)
    assert torch.equal(graphs(views), encode(None, views))
    assert graphs.captured == []
