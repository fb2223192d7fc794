"""Markdown tables from a results folder of the GPU benchmark (encoder_check.jsonl, engine.jsonl,
e2e_*.json, dmon_*.txt).  python3 bench/gpu/summarize.py /tmp/ocw-results
Times in dmon files are the device's local time; run this on the device, or with the same TZ."""

from __future__ import annotations

import contextlib
import datetime as dt
import glob
import json
import os
import sys
from pathlib import Path


def jsonl(path: str) -> list[dict]:
    try:
        return [json.loads(line) for line in open(path) if line.strip()]
    except OSError:
        return []


def dmon(path: str) -> list[tuple[float, dict[str, float]]]:
    rows, cols = [], None
    for line in Path(path).read_text(errors="replace").splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "#Date":
            cols = parts[1:]  # Time gpu fb bar1 ccpm sm mem ...
            continue
        if parts[0].startswith("#") or cols is None or len(parts) < len(cols) + 1:
            continue
        try:
            t = dt.datetime.strptime(parts[0] + " " + parts[1], "%Y%m%d %H:%M:%S").timestamp()
        except ValueError:
            continue
        vals = {}
        for name, v in zip(cols[1:], parts[2:], strict=False):
            with contextlib.suppress(ValueError):
                vals[name] = float(v)
        rows.append((t, vals))
    return rows


def window(rows, t0: float, t1: float) -> dict[str, float] | None:
    sel = [v for t, v in rows if t0 <= t <= t1]
    if not sel:
        return None
    out = {"samples": len(sel)}
    for k in ("sm", "mem"):
        xs = [v[k] for v in sel if k in v]
        if xs:
            out[f"{k}_mean"] = round(sum(xs) / len(xs), 1)
    fb = [v["fb"] for v in sel if "fb" in v]
    if fb:
        out["fb_max_mib"] = max(fb)
    return out


def main(d: str) -> None:
    print(f"# GPU benchmark summary ({d})\n")
    probe = os.path.join(d, "probe.txt")
    if os.path.exists(probe):
        print("```\n" + Path(probe).read_text().strip() + "\n```\n")
    for r in jsonl(os.path.join(d, "encoder_check.jsonl"))[-1:]:
        print(f"## Vision encoder: fast vs stock ({r.get('device')}, torch {r.get('torch')})\n")
        print(
            f"pages checked: {r.get('check_sizes')}  \nstock bf16 vs fp32 reference (rel. L2, per "
            f"page): {r.get('stock_vs_ref32')}\n"
        )
        print(
            "| variant | pass | max rel vs stock | max rel vs fp32 ref | worst / stock error "
            "|\n|---|---|---|---|---|"
        )
        for k, c in r.get("checks", {}).items():
            if "error" in c:
                print(f"| {k} | error: {c['error'][:120]} | | | |")
                continue
            print(
                f"| {k} | {c.get('pass')} | {max(c['vs_stock']):.3g} | "
                f"{max(c.get('vs_ref32', [float('nan')])):.3g} | "
                f"{c.get('worst_ratio_to_stock_error')} |"
            )
        t = r.get("timing", {})
        if t:
            print(
                f"\n{r.get('bench_pages')} pages, {r.get('tflop_per_page')} TFLOP/page (matrix "
                f"work), peak {r.get('peak_mem_gib')} GiB\n"
            )
            print("| path | ms/page | pages/s | TFLOP/s | first call s |\n|---|---|---|---|---|")
            for k, v in t.items():
                if "error" in v:
                    print(f"| {k} | error: {v['error'][:120]} | | | |")
                else:
                    print(
                        f"| {k} | {v['ms_per_page']} | {v['pages_per_s']} | {v['tflops']} | "
                        f"{v.get('first_call_s', '')} |"
                    )
        if r.get("profile_4_pages"):
            print(f"\nprofiler, 4 pages: {json.dumps(r['profile_4_pages'])}")
        print()
    eng = jsonl(os.path.join(d, "engine.jsonl"))
    if eng:
        print("## Engine: render at 144 DPI first, then one LLM.generate() over all pages\n")
        print(
            "| run | max_tokens | pages | pages/s | out tok/s | prompt tok | start s | SM % | mem "
            "% |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for r in eng:
            dm = os.path.join(d, f"dmon_{r['label']}.txt")
            rows = dmon(dm) if os.path.exists(dm) else []
            for ph in r.get("phases", []):
                w = window(rows, ph["t_start"], ph["t_end"]) or {}
                print(
                    f"| {r['label']} | {ph['max_tokens']} | {r['pages']} | {ph['pages_per_s']} | "
                    f"{ph['out_tok_per_s']} | "
                    f"{ph['prompt_tokens_mean']} | {r['init_s']} | {w.get('sm_mean', '')} | "
                    f"{w.get('mem_mean', '')} |"
                )
        print(
            "\n| run | GPU mem start / after init / peak / end GiB | host RSS start / end GiB | "
            "input prep ms/page (1 thread) | renderer |"
        )
        print("|---|---|---|---|---|")
        for r in eng:
            print(
                f"| {r['label']} | {r['gpu_mem_start_gib']} / {r.get('gpu_mem_after_init_gib')} / "
                f"{r['gpu_mem_peak_gib']} / {r['gpu_mem_end_gib']} | "
                f"{r['rss_start_gib']} / {r['rss_end_gib']} | {r['input_prep']['ms_per_page']} | "
                f"{r['renderer']} |"
            )
        toks = {
            os.path.basename(f)[7:-5]: json.loads(Path(f).read_text())
            for f in glob.glob(os.path.join(d, "tokens_*.json"))
        }
        if "script" in toks:
            for k, v in toks.items():
                if k == "script":
                    continue
                same = sum(
                    a == b
                    for x, y in zip(toks["script"], v, strict=False)
                    for a, b in zip(x, y, strict=False)
                )
                total = sum(min(len(x), len(y)) for x, y in zip(toks["script"], v, strict=False))
                print(
                    f"\noutput ids of the first {len(v)} pages, {k} vs script: {same}/{total} "
                    "equal (random weights: near-ties flip)"
                )
        print()
    for f in sorted(glob.glob(os.path.join(d, "e2e_*.json"))):
        r = json.loads(Path(f).read_text())
        rows = []
        dm = os.path.join(d, f"dmon_e2e_{r['label']}.txt")
        if os.path.exists(dm):
            rows = dmon(dm)
        a = r.get("a", {})
        # a cut phase a has no end stamp
        end = a.get("t_end", a.get("t_start", 0) + a.get("elapsed_s", 0))
        w = window(rows, a["t_start"], end) if a and rows else {}
        print(f"## Daemon end to end: {r['label']}\n")
        print(
            f"- start to ready: {r.get('start_to_ready_s')} s (compile cache warm before: "
            f"{r.get('cache_warm')})"
        )
        if a.get("cut"):
            print(
                f"- a: **cut by the time limit** after {a['elapsed_s']} s with {a['pages']} pages "
                f"done, status {a['status']}"
            )
        elif a:
            print(
                f"- a: {a['pages']} pages, {a['documents']} documents, {a['elapsed_s']} s: "
                f"**{a['pages_per_s']} pages/s**, "
                f"{a['out_tok_per_s']} output tok/s, status {a['status']}, SM "
                f"{w.get('sm_mean') if w else '?'} %"
            )
            if a.get("steady"):
                print(f"- a, 25 %–75 % of the pages: {a['steady']}")
        if r.get("engine_phases_s"):
            print(f"- engine seconds per page, by phase (means): {r['engine_phases_s']}")
        if r.get("d"):
            dd = r["d"]
            print(
                f"- d: one page alone {dd.get('solo_latency_s')} s; dropped "
                f"{dd['urgent_dropped_after_s']} s into doc300 "
                f"({dd['doc_pages']} pages): {dd['urgent_latency_s']} s; doc300 took "
                f"{dd['doc300_s']} s"
            )
        print(
            f"- e: GPU mem ready {r.get('gpu_mem_ready_gib')} / end {r.get('gpu_mem_end_gib')} "
            "GiB; RSS ready "
            f"{r.get('rss_ready_gib')} / end {r.get('rss_end_gib')} GiB; loop lag "
            f"{r.get('loop_lag_s')} s "
            f"(worst {r.get('loop_max_lag_s')} s); "
            f"shutdown {r.get('shutdown_s')} s, exit {r.get('exit_code')}"
        )
        print()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/ocw-results")
