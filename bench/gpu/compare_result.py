"""The one JSON line of compare.sh, from its results folder: e2e_cold.json, e2e_warm.json,
engine.jsonl.

    python3 -I bench/gpu/compare_result.py /tmp/ocw-results

The line names the settings that ran: ``rotation`` (``[render] rotate_pages`` as the daemon's own
loader resolved it, with ``oriented_pages`` of ``pages`` that orientation detection ran on),
``guard``, ``runner`` and ``card``; ``reused_pages`` should be 0 (a page duplicate reuse answered
cost the engine nothing). Standard library only, and a results file cut while it was written is
read as missing, so the line comes out whole whatever a step left.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def load(path: Path) -> dict:
    """A result file's object; {} where it is missing, cut short or not an object."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def records(path: Path) -> list[dict]:
    """The objects of a JSON-lines file, skipping a line a step cut while writing it."""
    try:
        lines = path.read_text().splitlines()
    except (OSError, ValueError):
        return []
    found = []
    for line in lines:
        try:
            found.append(json.loads(line))
        except ValueError:
            continue
    return [f for f in found if isinstance(f, dict)]


def guard(run: dict) -> str:
    """How the run's first rung guarded against loops: ``off``, ``stop`` (vLLM's repetition stop),
    ``gpu`` (the n-gram kernel in the V2 sampler) or ``host`` (the n-gram logits processor)."""
    config = run.get("config", "")
    if 'guard = "stop"' in config:
        return "stop"
    if "ngram_size = 0" in config:
        return "off"
    return "gpu" if run.get("restart", {}).get("v2_sampler_guard") else "host"


def result(folder: Path) -> dict:
    cold, warm = load(folder / "e2e_cold.json"), load(folder / "e2e_warm.json")
    scripts = records(folder / "engine.jsonl")
    script = next((s for s in reversed(scripts) if s.get("label") == "script"), {})
    phase = next((p for p in script.get("phases", []) if p.get("max_tokens") == 1000), {})
    # the run that carried the load (the cold one)
    load_run = warm if "a" in warm or "d" in warm else cold
    daemon = load_run.get("a", {}).get("pages_per_s")
    script_rate = phase.get("pages_per_s")
    d, d0 = load_run.get("d", {}), load_run.get("d0", {})
    return {
        "ratio": round(daemon / script_rate, 2) if daemon and script_rate else None,
        "daemon_pages_per_s": daemon,
        "script_pages_per_s": script_rate,
        "urgent_s": d.get("urgent_latency_s"),
        "urgent_alone_s": load_run.get("solo_latency_s"),
        "cold_ready_s": cold.get("start_to_ready_s"),
        "warm_ready_s": warm.get("start_to_ready_s"),
        "date": (load_run.get("date") or script.get("date") or "")[:10],
        "vllm": script.get("vllm") or cold.get("restart", {}).get("vllm"),
        "pages": load_run.get("a", {}).get("pages"),
        "doc300_pages_per_s": d.get("doc300_pages_per_s"),
        "doc300_alone_pages_per_s": d0.get("doc300_pages_per_s"),
        "sizing": [
            load_run.get("restart", {}).get(k)
            for k in ("max_concurrency", "max_num_batched_tokens", "sizing")
        ],
        "rotation": load_run.get("settings", {}).get("rotate_pages"),
        "oriented_pages": load_run.get("a", {}).get("oriented_pages"),
        "reused_pages": load_run.get("reused_pages"),
        "guard": guard(load_run),
        "runner": load_run.get("restart", {}).get("runner"),
        "card": load_run.get("card") or cold.get("card"),
    }


def main() -> int:
    """Print the line; a fault of this script is printed as the line's ``error``, never lost."""
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/ocw-results")
    try:
        line = result(folder)
    except Exception as exc:  # noqa: BLE001 - the line must say why it is empty
        print(json.dumps({"error": f"compare_result.py: {type(exc).__name__}: {exc}"}), flush=True)
        return 1
    print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
