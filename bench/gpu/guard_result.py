"""guard.sh's one JSON line, from its results folder: per lane (e2e_<label>.json) pages/s, output
tokens/s, how the pages finished, start to ready and the runner vLLM chose, each lane's pages/s
against ``off``'s; and the engine's import seconds without and with bytecode (imports.log).

  python3 bench/gpu/guard_result.py /tmp/ocw-results
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def load(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def lane(run: dict) -> dict:
    a, restart = run.get("a", {}), run.get("restart", {})
    return {
        "pages": a.get("pages"),
        "pages_per_s": a.get("pages_per_s"),
        "out_tok_per_s": a.get("out_tok_per_s"),
        "tokens_per_page": round(a["completion_tokens"] / a["pages"], 1)
        if a.get("pages")
        else None,
        "finish": a.get("finish_reasons"),
        "cut": a.get("cut", False),
        "ready_s": run.get("start_to_ready_s"),
        "runner": restart.get("runner"),
        "decode_s": (run.get("engine_phases_s") or {}).get("decode"),
    }


def result(folder: Path) -> dict:
    lanes = {p.stem[len("e2e_") :]: lane(load(p)) for p in sorted(folder.glob("e2e_*.json"))}
    off = (lanes.get("off") or {}).get("pages_per_s")
    for value in lanes.values():
        rate = value.get("pages_per_s")
        value["vs_off"] = round(rate / off, 3) if rate and off else None
    text = (folder / "imports.log").read_text() if (folder / "imports.log").exists() else ""
    imports = dict(
        zip(
            ("no_bytecode_s", "bytecode_s"),
            map(float, re.findall(r"IMPORT ([\d.]+) s", text)[:2]),
            strict=False,
        )
    )
    dates = [load(p).get("date", "") for p in folder.glob("e2e_*.json")]
    return {"date": (min(dates) if dates else "")[:10], "lanes": lanes, "imports": imports}


if __name__ == "__main__":
    print(
        json.dumps(result(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/ocw-results"))),
        flush=True,
    )
