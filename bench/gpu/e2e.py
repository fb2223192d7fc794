"""The daemon end to end on a GPU machine: `ocrwatch run` with the vLLM engine (random weights,
forced output length), files dropped into its inbox, sidecars awaited. Run by device_run.sh,
run_x2.sh and compare.sh.

Phases, one daemon process, same engine settings throughout:
  start  cold or warm start to /readyz (compile cache in --cache-dir)
  solo   a fresh one-page PDF alone, into the urgent inbox: latency drop -> NAME.json (the
         reference for d)
  a      every corpus PDF, --repeat times, dropped at once: pages/s, output tokens/s
  d0     doc300.pdf (>= 300 pages) alone: its pages/s (the reference for d)
  d      doc300.pdf dropped; once --d-after pages of it are done, another fresh one-page PDF is
         dropped into the urgent inbox (priority 90, the main inbox has the default 50): its
         latency against solo; then doc300 is awaited to the end: its pages/s against d0
  e      GPU memory (NVML) and host RSS of the daemon's process tree at ready and at the end; the
         daemon's /metrics (loop lag, tokens, stage latencies) saved at the end

The config names the model, the forced output length and only the keys given as options, so a run
without options measures the shipped defaults. ``settings`` is the daemon's own loader's reading of
that config and environment (``rotate_pages`` included), ``card`` the GPU's name (nvidia-smi);
each phase counts the pages its sidecars say orientation detection ran on, and the pages duplicate
reuse answered. Every drop is bytes no earlier drop had (a PDF comment appended; solo and urgent are
pages made by fresh_page.py), so the ledger never answers one. Start to ready is broken down from
the daemon's log (``restart``: ocrwatch's import, engine build and warm-up seconds, and vLLM's
weights, compilation, graph capture and engine-core initialisation). Prints one line per phase and
ends with ``RESULT {json}``; writes e2e_<label>.json, series_<label>.jsonl (/metrics once a
second), metrics_<label>.txt and daemon_<label>.log under --out. ``--engine tesseract`` is a dry
run of the harness on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "bench" / "gpu"))
from common import metric_samples as samples  # bench/ is not a package
from fresh_page import write as fresh_page


def gib(x: float) -> float:
    return round(x / 2**30, 2)


def visible_gpus() -> list[int]:
    """NVML indices of the GPUs this run may use (NVML ignores CUDA_VISIBLE_DEVICES)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    return [int(x) for x in env.split(",") if x.strip().isdigit()] if env else []


class Probe:
    """GPU memory (NVML, summed over the visible GPUs) and RSS of a process tree (psutil); zeros
    where
    either is missing (a CPU dry run)."""

    def __init__(self):
        try:
            import pynvml

            pynvml.nvmlInit()
            ids = visible_gpus() or list(range(pynvml.nvmlDeviceGetCount()))
            self.nvml, self.hs = pynvml, [pynvml.nvmlDeviceGetHandleByIndex(i) for i in ids]
        except Exception:
            self.nvml = None
        try:
            import psutil

            self.ps = psutil
        except ImportError:
            self.ps = None

    def gpu(self) -> int:
        return sum(self.nvml.nvmlDeviceGetMemoryInfo(h).used for h in self.hs) if self.nvml else 0

    def rss(self, pid: int) -> int:
        return sum(self.tree(pid).values())

    def tree(self, pid: int) -> dict[str, int]:
        """RSS of each process of the tree, named by its title (vLLM names its processes, e.g.
        EngineCore_DP0)."""
        if self.ps is None:
            return {}
        out: dict[str, int] = {}
        try:
            root = self.ps.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except self.ps.Error:
            return {}
        for p in procs:
            try:
                name = f"{p.pid}:{p.name()}"
                out[name] = p.memory_info().rss
            except self.ps.Error:
                pass
        return out


def http(url: str, timeout: float = 2.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""
    except OSError:
        return 0, ""


SERIES = {
    "ok": 'ocrwatch_pages_total{status="ok"}',
    "inflight": "ocrwatch_inflight_pages",
    "ready": 'ocrwatch_queue_depth{stage="ready"}',
    "rendering": 'ocrwatch_queue_depth{stage="rendering"}',
    "render_queue": 'ocrwatch_queue_depth{stage="render_queue"}',
    "docs_running": 'ocrwatch_active_documents{state="running"}',
    "docs_waiting": 'ocrwatch_active_documents{state="waiting"}',
    "completion_tokens": 'ocrwatch_tokens_total{kind="completion"}',
    "loop_lag": "ocrwatch_event_loop_lag_seconds",
}


class Series(threading.Thread):
    """/metrics once a second while the phases run: pages done, pages inside the engine, the ready
    and
    render queues, so the steady-state rate and how full the engine was can be read off, not only
    the totals."""

    def __init__(self, base: str, path: Path):
        super().__init__(daemon=True)
        self.base, self.path, self.rows, self.stop = base, path, [], threading.Event()

    def run(self) -> None:
        with open(self.path, "w") as handle:
            while not self.stop.wait(1.0):
                code, text = http(self.base + "/metrics")
                if code != 200:
                    continue
                m = samples(text)
                row = {"t": round(time.time(), 2), **{k: m.get(v) for k, v in SERIES.items()}}
                self.rows.append(row)
                handle.write(json.dumps(row) + "\n")
                handle.flush()

    def steady(self, t_start: float, base_ok: float, pages: int) -> dict:
        """Pages/s between 25 % and 75 % of the phase's pages, and the mean pages in the engine
        meanwhile: the rate without the ramp-up and the last, part-empty wave."""
        rows = [r for r in self.rows if r["t"] >= t_start and r["ok"] is not None]
        lo = next((r for r in rows if r["ok"] - base_ok >= 0.25 * pages), None)
        hi = next((r for r in rows if r["ok"] - base_ok >= 0.75 * pages), None)
        if lo is None or hi is None or hi["t"] <= lo["t"]:
            return {}
        window = [r for r in rows if lo["t"] <= r["t"] <= hi["t"]]
        mean = lambda k: round(sum(r[k] or 0 for r in window) / len(window), 1)
        return dict(
            pages_per_s=round((hi["ok"] - lo["ok"]) / (hi["t"] - lo["t"]), 3),
            window_s=round(hi["t"] - lo["t"], 1),
            mean_inflight=mean("inflight"),
            mean_ready=mean("ready"),
            mean_rendering=mean("rendering"),
            mean_render_queue=mean("render_queue"),
        )


def engine_phases(text: str) -> dict:
    """Mean seconds per recognition in each engine phase (``ocrwatch_engine_seconds``)."""
    m = samples(text)
    out = {}
    for key, total in m.items():
        if key.startswith("ocrwatch_engine_seconds_sum{"):
            count = m.get(key.replace("_sum{", "_count{"), 0)
            if count:
                out[key.split('"')[1]] = round(total / count, 3)
    return out


def drop(src: Path, inbox: Path, name: str) -> float:
    """Copy under a dot-name (ignored by the watcher), then rename into place: one moved-in
    event. A PDF comment naming the drop is appended, so no two drops have the same bytes and
    duplicate reuse (the ledger's answer for content already done) never answers one."""
    tmp = inbox / f".{name}.part"
    shutil.copyfile(src, tmp)
    with open(tmp, "ab") as handle:
        handle.write(f"\n%ocrwatch-bench {name} {time.time_ns()}\n".encode())
    os.rename(tmp, inbox / name)
    return time.time()


def sidecar(inbox: Path, name: str) -> Path | None:
    ok, err = inbox / f"{name}.json", inbox / f"{name}.error.json"
    return ok if ok.exists() else err if err.exists() else None


def wait_for(
    inbox: Path, names: list[str], deadline: float, proc: subprocess.Popen
) -> dict[str, float]:
    done: dict[str, float] = {}
    while len(done) < len(names) and time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"daemon exited with {proc.returncode}")
        for n in names:
            if n not in done and sidecar(inbox, n):
                done[n] = time.time()
        time.sleep(0.05)
    return done


def pages_done(inbox: Path, name: str) -> int:
    p = sidecar(inbox, name)
    return len(json.loads(p.read_text()).get("pages", [])) if p else 0


def doc_stats(inbox: Path, names: list[str]) -> dict:
    """Pages, tokens and finish reasons from the sidecars; ``oriented_pages``: pages orientation
    detection ran on (their ``orientation`` is not null); ``reused_pages``: pages of documents a
    duplicate's reuse answered (``reused_from``), which cost the engine nothing."""
    pages = tokens = failed = oriented = reused = 0
    status: dict[str, int] = {}
    finish: dict[str, int] = {}
    for n in names:
        p = sidecar(inbox, n)
        if p is None:
            status["missing"] = status.get("missing", 0) + 1
            continue
        d = json.loads(p.read_text())
        st = d.get("status", "error" if p.name.endswith(".error.json") else "?")
        status[st] = status.get(st, 0) + 1
        reused += len(d.get("pages", [])) if d.get("reused_from") else 0
        for pg in d.get("pages", []):
            pages += 1
            oriented += pg.get("orientation") is not None
            t = pg.get("tokens") or {}
            tokens += (t.get("completion") or 0) if isinstance(t, dict) else int(t or 0)
            failed += pg.get("status") not in (None, "ok")
            reason = str(pg.get("finish_reason"))
            finish[reason] = finish.get(reason, 0) + 1
    return dict(
        pages=pages,
        completion_tokens=tokens,
        failed_pages=failed,
        oriented_pages=oriented,
        reused_pages=reused,
        status=status,
        finish_reasons=finish,
    )


def reused_pages(*inboxes: Path) -> int:
    """Pages of the documents in these inboxes that a duplicate's reuse answered: 0, or a phase's
    pages/s counts work the engine never did."""
    return sum(
        doc_stats(i, sorted(p.name for p in i.iterdir() if p.suffix == ".pdf"))["reused_pages"]
        for i in inboxes
    )


def pdf_pages(path: Path) -> int:
    try:
        import pypdfium2 as pdfium

        return len(pdfium.PdfDocument(str(path)))
    except Exception:
        out = subprocess.run(["pdfinfo", str(path)], capture_output=True, text=True).stdout
        return int(next(line.split()[1] for line in out.splitlines() if line.startswith("Pages:")))


RESTART = {  # what the daemon's log says about where start-up time went (vLLM 0.26's wording)
    "weights_s": r"Loading weights took ([\d.]+) seconds",
    "model_load_s": r"Model loading took [\d.]+ GiB (?:memory )?and ([\d.]+) seconds",
    "dynamo_s": r"Dynamo bytecode transform time: ([\d.]+) s",
    "compile_total_s": r"torch.compile took ([\d.]+) s in total",
    "compile_cache_load_s": r"from the cache, took ([\d.]+) s",
    "graphs_s": r"Graph capturing finished in ([\d.]+) secs",
    "init_engine_s": r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s",
    "kv_cache_tokens": r"GPU KV cache size: ([\d,]+) tokens",
}


def restart_breakdown(log_text: str) -> dict:
    """Seconds of each start-up step from the daemon's log: vLLM's lines (RESTART, the first match
    each) and ocrwatch's ``vllm_engine_ready`` event (import, engine build, warm-up page,
    sizing)."""
    out: dict = {}
    for key, pattern in RESTART.items():
        m = re.search(pattern, log_text)
        if m:
            out[key] = float(m.group(1).replace(",", ""))
    out["v2_sampler_guard"] = "n-gram guard in the V2 sampler" in log_text
    out["guard_on_host_fallback"] = "vllm_ngram_guard_on_the_host" in log_text
    out["runner"] = "V2" if "Using V2 Model Runner" in log_text else "V1"
    for line in log_text.splitlines():
        if '"vllm_engine_ready"' in line:
            try:
                ev = json.loads(line[line.index("{") :])
            except ValueError:
                continue
            out.update(
                {
                    k: ev.get(k)
                    for k in (
                        "seconds",
                        "seconds_import",
                        "seconds_engine",
                        "seconds_warmup",
                        "max_concurrency",
                        "max_num_batched_tokens",
                        "sizing",
                        "vllm",
                    )
                }
            )
            break
    return out


def vllm_keys(a) -> dict:
    """The [engine.vllm] keys this run sets; an option left out keeps the daemon's own default."""
    keys: dict = dict(
        model=a.model,
        load_format="dummy",
        ignore_eos=True,
        max_tokens=a.max_tokens,
        compile_cache_dir=a.cache_dir,
    )
    given = dict(
        max_num_seqs=a.max_num_seqs,
        max_num_batched_tokens=a.max_num_batched_tokens,
        data_parallel_size=a.dp,
        tensor_parallel_size=a.tp,
        replicas=a.replicas,
        guard=a.guard,
        stop_pattern=a.stop_pattern,
        stop_count=a.stop_count,
    )
    keys.update({k: v for k, v in given.items() if v is not None})
    if a.fast:
        keys["fast_encoder"] = True
    if a.encoder_graphs:
        keys["encoder_cuda_graphs"] = True
    if a.replica_processes is not None:
        keys["replica_processes"] = (
            a.replica_processes if a.replica_processes == "auto" else a.replica_processes == "true"
        )
    # the guard off in every rung: no logits processor is registered
    if a.ngram_processor == "none":
        keys.update(ngram_size=0, window_size=0, ladder=[])
    elif a.ngram_processor is not None:
        keys["ngram_processor"] = a.ngram_processor
    return keys


SETTINGS = """\
import json, sys
from ocrwatch.config import load
cfg = load(__import__("pathlib").Path(sys.argv[1]))
r, v = cfg.render, cfg.engine.vllm
print(json.dumps(dict(rotate_pages=r.rotate_pages, deskew=r.deskew, renderer=r.renderer,
                      guard=v.guard, ngram_processor=v.ngram_processor, ngram_size=v.ngram_size)))
"""


def settings(cfg: Path, env: dict) -> dict:
    """The settings that shape a run as the daemon resolves them: its own loader (``config.load``)
    on the same file, environment and folder (``OCRWATCH_RENDER_ROTATE_PAGES`` and the like
    included), not what this script meant to write; ``error`` when it could not say."""
    done = subprocess.run(
        [sys.executable, "-c", SETTINGS, str(cfg)],
        cwd=str(REPO),
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1][:300]}


def card() -> str | None:
    """The GPU's name as nvidia-smi gives it (the first one this run may use); None without
    one."""
    ids = visible_gpus()
    cmd = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]
    try:
        out = subprocess.run(
            cmd + (["-i", str(ids[0])] if ids else []), capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = [line.strip() for line in out.splitlines() if line.strip()]
    return names[0] if names else None


def write_config(path: Path, work: Path, a) -> None:
    renderer = "pdftoppm" if shutil.which("pdftoppm") else "pdfium"
    vllm = "".join(f"{k} = {json.dumps(v)}\n" for k, v in vllm_keys(a).items())
    engine_args = "".join(f"{k} = {json.dumps(v)}\n" for k, v in json.loads(a.engine_args).items())
    scheduler = f"[scheduler]\nmax_inflight_pages = {a.max_inflight}\n" if a.max_inflight else ""
    dpi = f"dpi = {a.dpi}\n" if a.dpi else ""
    path.write_text(f"""\
state_dir = "{work}/state"

[engine]
kind = "{a.engine}"

[engine.vllm]
{vllm}
[engine.vllm.engine_args]
{engine_args}
{scheduler}
[render]
{dpi}renderer = "{renderer}"

[log]
format = "json"
level = "info"

[metrics]
listen = "127.0.0.1:{a.port}"

[[inbox]]
path = "{work}/inbox"
settle_seconds = 0.2

[[inbox]]
path = "{work}/urgent"
settle_seconds = 0.2
priority = 90
""")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", default="daemon")
    ap.add_argument(
        "--engine",
        default="vllm",
        help="engine kind; tesseract for a dry run of this harness without a GPU",
    )
    ap.add_argument("--fast", action="store_true", help="[engine.vllm] fast_encoder = true")
    ap.add_argument(
        "--encoder-graphs",
        action="store_true",
        help="[engine.vllm] encoder_cuda_graphs (with --fast)",
    )
    ap.add_argument("--model", default=str(REPO / ".gpu/dsocr2"))
    ap.add_argument("--corpus", default=str(REPO / ".gpu/corpus"))
    ap.add_argument("--repeat", type=int, default=3, help="drops of every corpus PDF in phase a")
    ap.add_argument(
        "--dpi", type=int, default=None, help="[render] dpi (default: the engine's own)"
    )
    ap.add_argument("--max-tokens", type=int, default=1000)
    ap.add_argument("--max-num-seqs", type=int, default=None)
    ap.add_argument("--max-num-batched-tokens", type=int, default=None)
    ap.add_argument("--engine-args", default="{}", help="[engine.vllm.engine_args] as JSON")
    ap.add_argument("--dp", type=int, default=None, help="[engine.vllm] data_parallel_size")
    ap.add_argument("--tp", type=int, default=None, help="[engine.vllm] tensor_parallel_size")
    ap.add_argument("--replicas", type=int, default=None, help="[engine.vllm] replicas")
    ap.add_argument(
        "--replica-processes",
        nargs="?",
        const="true",
        default=None,
        choices=["auto", "true", "false"],
        help="[engine.vllm] replica_processes (the option alone: true)",
    )
    ap.add_argument(
        "--ngram-processor",
        choices=("batched", "per_request", "gpu", "none"),
        default=None,
        help="none: the guard off in every rung, so no logits processor is registered; gpu: the "
        "kernel "
        "in vLLM's V2 sampler (with VLLM_USE_V2_MODEL_RUNNER=1 in the environment)",
    )
    ap.add_argument(
        "--guard",
        choices=("ban", "stop"),
        default=None,
        help="[engine.vllm] guard: ban (DeepSeek's n-gram rule, a logits processor) or stop "
        "(vLLM's "
        "repetition stop, no processor; with --stop-pattern, --stop-count)",
    )
    ap.add_argument("--stop-pattern", type=int, default=None, help="[engine.vllm] stop_pattern")
    ap.add_argument("--stop-count", type=int, default=None, help="[engine.vllm] stop_count")
    ap.add_argument("--max-inflight", type=int, default=None, help="[scheduler] max_inflight_pages")
    ap.add_argument("--cache-dir", default="/tmp/ocw-e2e-cache")
    ap.add_argument("--work", default="/tmp/ocw-e2e")
    ap.add_argument("--port", type=int, default=9464)
    ap.add_argument("--phases", default="solo,a,d")
    ap.add_argument(
        "--d-after", type=int, default=30, help="doc300 pages done before the urgent page drops"
    )
    ap.add_argument("--timeout", type=float, default=420, help="seconds for each phase")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    phases = set(a.phases.split(","))

    work = Path(a.work)
    shutil.rmtree(work, ignore_errors=True)
    (work / "inbox").mkdir(parents=True)
    (work / "urgent").mkdir(parents=True)
    cfg = work / "ocrwatch.toml"
    write_config(cfg, work, a)
    corpus = Path(a.corpus)
    docs = sorted((corpus / "docs").glob("*.pdf"))
    res: dict = dict(
        label=a.label,
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        fast=a.fast,
        config=cfg.read_text(),
        cache_warm=Path(a.cache_dir).exists() and any(Path(a.cache_dir).iterdir()),
    )
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    env = dict(os.environ, PYTHONUNBUFFERED="1")
    res["settings"] = settings(cfg, env)
    res["card"] = card()
    # solo's page and the urgent page: two pages no run has seen, made alike (fresh_page.py)
    nonce = f"{time.time_ns():x}"
    (work / "pages").mkdir()
    solo_page = fresh_page(work / "pages" / "solo.pdf", f"solo {nonce}")
    urgent_page = fresh_page(work / "pages" / "urgent.pdf", f"urgent {nonce}")
    probe = Probe()
    res["gpu_mem_before_gib"] = gib(probe.gpu())
    log = open(out / f"daemon_{a.label}.log", "w")  # noqa: SIM115 - the daemon's stdout, its life long
    t0 = time.time()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ocrwatch", "run", "--config", str(cfg)],
        cwd=str(REPO),
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    (out / f"daemon_{a.label}.pid").write_text(str(proc.pid))
    base = f"http://127.0.0.1:{a.port}"
    inbox, urgent_inbox = work / "inbox", work / "urgent"
    try:
        while http(base + "/readyz")[0] != 200:
            if proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {proc.returncode} before ready")
            if time.time() - t0 > 600:
                raise RuntimeError("daemon not ready after 600 s")
            time.sleep(0.5)
        res["start_to_ready_s"] = round(time.time() - t0, 1)
        log.flush()
        res["restart"] = restart_breakdown(
            (out / f"daemon_{a.label}.log").read_text(errors="replace")
        )
        res["gpu_mem_ready_gib"] = gib(probe.gpu())
        res["rss_ready_gib"] = gib(probe.rss(proc.pid))
        res["rss_tree"] = {"ready": {k: gib(v) for k, v in probe.tree(proc.pid).items()}}
        print(f"[{a.label}] ready in {res['start_to_ready_s']} s", flush=True)
        series = Series(base, out / f"series_{a.label}.jsonl")
        series.start()

        if "solo" in phases:
            t = drop(solo_page, urgent_inbox, "solo.pdf")
            done = wait_for(urgent_inbox, ["solo.pdf"], t + a.timeout, proc)
            res["solo_latency_s"] = round(done["solo.pdf"] - t, 2) if done else None
            print(f"[{a.label}] one page alone: {res['solo_latency_s']} s", flush=True)

        if "a" in phases:
            names = []
            base_ok = samples(http(base + "/metrics")[1]).get(SERIES["ok"], 0)
            w0 = time.time()
            for r in range(a.repeat):
                for d in docs:
                    names.append(f"a{r}-{d.name}")
                    drop(d, inbox, names[-1])
            try:
                done = wait_for(inbox, names, w0 + a.timeout, proc)
            # the step's time limit (timeout -s INT): keep what (a) got done
            except KeyboardInterrupt:
                res["a"] = dict(
                    cut=True,
                    t_start=round(w0, 2),
                    elapsed_s=round(time.time() - w0, 1),
                    **doc_stats(inbox, names),
                )
                raise
            w1 = max(done.values()) if done else time.time()
            st = doc_stats(inbox, names)
            el = w1 - w0
            res["a"] = dict(
                documents=len(names),
                finished=len(done),
                t_start=round(w0, 2),
                t_end=round(w1, 2),
                elapsed_s=round(el, 1),
                pages_per_s=round(st["pages"] / el, 3),
                out_tok_per_s=round(st["completion_tokens"] / el, 1),
                **st,
            )
            res["a"]["steady"] = series.steady(w0, base_ok, st["pages"])
            res["rss_tree"]["after_a"] = {k: gib(v) for k, v in probe.tree(proc.pid).items()}
            print(
                f"[{a.label}] a: {res['a']['pages']} pages in {el:.1f} s = "
                f"{res['a']['pages_per_s']} pages/s, "
                f"{res['a']['out_tok_per_s']} tok/s; steady {res['a']['steady']}",
                flush=True,
            )

        big = corpus / "doc300.pdf"
        n_big = pdf_pages(big) if phases & {"d0", "d"} else 0
        done_before = lambda: samples(http(base + "/metrics")[1]).get(SERIES["ok"], 0)
        if "d0" in phases:
            w0 = drop(big, inbox, "alone300.pdf")
            big_done = wait_for(inbox, ["alone300.pdf"], w0 + a.timeout, proc)
            el = big_done["alone300.pdf"] - w0 if big_done else None
            res["d0"] = dict(
                doc_pages=n_big,
                doc300_s=round(el, 1) if el else None,
                doc300_pages_per_s=round(n_big / el, 3) if el else None,
                t_start=round(w0, 2),
            )
            print(
                f"[{a.label}] d0: doc300 alone {res['d0']['doc300_s']} s = "
                f"{res['d0']['doc300_pages_per_s']} pages/s",
                flush=True,
            )

        if "d" in phases:
            ok_before = done_before()
            w0 = drop(big, inbox, "doc300.pdf")
            # wait until the big document is well under way: --d-after of its pages finished
            # (metrics), at most 30 s
            t_urgent = None
            while time.time() - w0 < a.timeout:
                ok = done_before()
                if ok - ok_before >= a.d_after or time.time() - w0 > 30:
                    break
                time.sleep(0.2)
            t_urgent = drop(urgent_page, urgent_inbox, "urgent.pdf")
            done = wait_for(urgent_inbox, ["urgent.pdf"], t_urgent + a.timeout, proc)
            urgent = round(done["urgent.pdf"] - t_urgent, 2) if done else None
            big_done = wait_for(inbox, ["doc300.pdf"], w0 + a.timeout, proc)
            res["d"] = dict(
                doc_pages=n_big,
                urgent_dropped_after_s=round(t_urgent - w0, 1),
                urgent_latency_s=urgent,
                solo_latency_s=res.get("solo_latency_s"),
                doc300_s=round(big_done["doc300.pdf"] - w0, 1) if big_done else None,
                doc300=doc_stats(inbox, ["doc300.pdf"]),
                t_start=round(w0, 2),
                t_end=round(time.time(), 2),
            )
            if big_done:
                res["d"]["doc300_pages_per_s"] = round(n_big / (big_done["doc300.pdf"] - w0), 3)
                alone = res.get("d0", {}).get("doc300_pages_per_s")
                if alone:
                    res["d"]["doc300_vs_alone"] = round(res["d"]["doc300_pages_per_s"] / alone, 3)
            print(
                f"[{a.label}] d: urgent page {urgent} s while doc300 ran (alone "
                f"{res.get('solo_latency_s')} s); "
                f"doc300 {res['d']['doc300_s']} s",
                flush=True,
            )

        res["reused_pages"] = reused_pages(inbox, urgent_inbox)
        res["gpu_mem_end_gib"] = gib(probe.gpu())
        res["rss_end_gib"] = gib(probe.rss(proc.pid))
        res["rss_tree"]["end"] = {k: gib(v) for k, v in probe.tree(proc.pid).items()}
        code, metrics = http(base + "/metrics")
        (out / f"metrics_{a.label}.txt").write_text(metrics)
        res["engine_phases_s"] = engine_phases(metrics)
        series.stop.set()
        m = samples(metrics)
        res["loop_lag_s"] = m.get("ocrwatch_event_loop_lag_seconds")
        res["loop_max_lag_s"] = m.get("ocrwatch_event_loop_max_lag_seconds")
    finally:
        # written before the stop too: a daemon slow to stop under `timeout -k` must not lose what
        # was measured
        (out / f"e2e_{a.label}.json").write_text(json.dumps(res, indent=1))
        t_stop = time.time()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        res["shutdown_s"] = round(time.time() - t_stop, 1)
        res["exit_code"] = proc.returncode
        print("RESULT " + json.dumps(res), flush=True)
        (out / f"e2e_{a.label}.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
