"""The GPU harness on the CPU: a step cannot outlive its deadline or hold the caller's output, and
compare.sh ends within its BUDGET with its JSON line whatever its steps do.

The failures these stand for were seen on the device: a step piped through ``tee | grep`` waited for
vLLM's engine-core child, which outlives its killed parent and holds the pipe, and compare.sh did
not return for more than ten minutes after its last measurement.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
STEP = REPO / "bench/gpu/step.py"

# A tool that starts a grandchild in a session of its own, holding the tool's stdout, then hangs
# (like the daemon e2e.py starts, or vLLM's engine core), printing a marker line first.
HANGING_TOOL = textwrap.dedent(
    """
    import subprocess, sys, time
    child = subprocess.Popen(["sleep", "600"], start_new_session=True)
    open(sys.argv[1], "w").write(str(child.pid))
    print("[fake] started", flush=True)
    time.sleep(600)
    """
)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def step(
    tmp_path: Path, until_s: float, *cmd: str, grace: float = 2.0
) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            str(STEP),
            "--until",
            str(time.time() + until_s),
            "--log",
            str(tmp_path / "step.log"),
            "--show",
            r"^\[",
            "--grace",
            str(grace),
            "--",
            *cmd,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done, time.monotonic() - started


def test_a_hanging_step_is_cut_at_its_deadline_with_everything_it_started(tmp_path: Path) -> None:
    tool = tmp_path / "tool.py"
    tool.write_text(HANGING_TOOL)
    pid_file = tmp_path / "grandchild.pid"
    done, seconds = step(tmp_path, 3, sys.executable, str(tool), str(pid_file))
    assert done.returncode == 124
    assert seconds < 3 + 2 + 5
    assert "[fake] started" in done.stdout
    assert not alive(int(pid_file.read_text()))
    assert "deadline reached" in (tmp_path / "step.log").read_text()


def test_a_child_that_outlives_its_parent_does_not_hold_the_step(tmp_path: Path) -> None:
    pid_file = tmp_path / "orphan.pid"
    script = f"setsid sleep 600 & echo $! > {pid_file}; echo '[parent] done'; exit 3"
    done, seconds = step(tmp_path, 60, "bash", "-c", script)
    assert done.returncode == 3  # the step's own status, long before its deadline
    assert seconds < 15
    assert "[parent] done" in done.stdout
    assert not alive(int(pid_file.read_text()))


def test_the_step_output_goes_to_its_file_not_a_pipe(tmp_path: Path) -> None:
    done, _ = step(tmp_path, 30, "bash", "-c", "ls -l /proc/self/fd/1 /proc/self/fd/0; echo hidden")
    text = (tmp_path / "step.log").read_text()
    assert "hidden" in text and "hidden" not in done.stdout
    assert "step.log" in text and "/dev/null" in text


@pytest.mark.timeout(90)
@pytest.mark.slow
def test_compare_ends_within_its_budget_with_its_json_line(tmp_path: Path) -> None:
    tool = tmp_path / "tool.py"
    tool.write_text(HANGING_TOOL.replace("sys.argv[1]", "'" + str(tmp_path / "pid") + "'"))
    budget = 25
    env = dict(
        os.environ,
        BUDGET=str(budget),
        OUT=str(tmp_path / "out"),
        RESULTS=str(tmp_path / "results"),
        INSTALL="true",
        E2E=str(tool),
        BENCH=str(tool),
    )
    started = time.monotonic()
    done = subprocess.run(
        ["bash", "bench/gpu/compare.sh"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=budget + 45,
    )
    seconds = time.monotonic() - started
    # The slack is for a loaded machine's process starts and grace periods; a step left to its own
    # deadline would run minutes past the budget.
    assert seconds <= budget + 15, done.stdout[-2000:]
    last = done.stdout.strip().splitlines()[-1]
    line = json.loads(last)
    assert set(line) >= {
        "ratio",
        "daemon_pages_per_s",
        "script_pages_per_s",
        "cold_ready_s",
        "date",
    }
    assert json.loads((tmp_path / "out/compare.json").read_text()) == line
    assert (tmp_path / "out/results_compare.tgz").exists()
    assert not alive(int((tmp_path / "pid").read_text()))


# --- compare.sh's line, whatever changes under a detached run ------------------------------------

# The load's two tools, as the device's would leave their results (e2e.py's JSON, engine_bench.py's
# JSON line). The cold "daemon" then does what a later device call did to a detached run: the
# working tree is copied over, here with a compare_result.py that no longer runs.
FAKE_E2E = textwrap.dedent(
    """
    import json, pathlib, sys
    args = sys.argv[1:]
    label, out = args[args.index("--label") + 1], pathlib.Path(args[args.index("--out") + 1])
    run = {"label": label, "date": "2026-12-08 10:00 UTC", "start_to_ready_s": 80.0,
           "settings": {"rotate_pages": True}, "card": "NVIDIA H100 80GB HBM3",
           "restart": {"runner": "V2", "v2_sampler_guard": True}, "reused_pages": 0}
    if label == "cold":
        run.update(a={"pages": 159, "pages_per_s": 10.0, "oriented_pages": 159},
                   solo_latency_s=3.0, d={"urgent_latency_s": 6.0})
        pathlib.Path("bench/gpu/compare_result.py").write_text("raise SystemExit('not this one')")
    (out / f"e2e_{label}.json").write_text(json.dumps(run))
    """
)
FAKE_BENCH = textwrap.dedent(
    """
    import json, sys
    args = sys.argv[1:]
    with open(args[args.index("--out") + 1], "a") as out:
        out.write('{"label": "script", "pha')  # a line an earlier step was cut in
        phase = {"max_tokens": 1000, "pages_per_s": 4.0}
        line = {"label": "script", "vllm": "0.26.0", "phases": [phase]}
        out.write("\\n" + json.dumps(line) + "\\n")
    """
)


@pytest.mark.timeout(120)
def test_compare_prints_its_whole_line_when_its_tree_and_environment_change_under_it(
    tmp_path: Path,
) -> None:
    root = tmp_path / "repo"
    (root / "bench").mkdir(parents=True)
    shutil.copytree(REPO / "bench/gpu", root / "bench/gpu")
    results = tmp_path / "results"
    results.mkdir()
    (results / "engine.jsonl").write_text(json.dumps({"label": "script", "vllm": "old"}) + "\n")
    # env.sh puts the unpacked wheels first on PYTHONPATH; one of them shadowing the standard
    # library must not change what prints the line.
    site = tmp_path / "site"
    site.mkdir()
    (site / "json.py").write_text("raise ImportError('a json.py of the wheel set')\n")
    tools = {}
    for name, text in (("e2e.py", FAKE_E2E), ("bench.py", FAKE_BENCH)):
        tools[name] = tmp_path / name
        tools[name].write_text(text)
    env = dict(
        os.environ,
        BUDGET="60",
        OUT=str(tmp_path / "out"),
        RESULTS=str(results),
        INSTALL="true",
        E2E=f"-I {tools['e2e.py']}",
        BENCH=f"-I {tools['bench.py']}",
        PYTHONPATH=str(site),
    )
    done = subprocess.run(
        ["bash", "bench/gpu/compare.sh"],
        cwd=root,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=100,
    )
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert "error" not in line, done.stdout[-2000:] + done.stderr[-2000:]
    assert line["ratio"] == 2.5 and line["vllm"] == "0.26.0"
    assert line["rotation"] is True and line["oriented_pages"] == line["pages"] == 159
    assert line["reused_pages"] == 0
    assert (line["guard"], line["runner"], line["card"]) == ("gpu", "V2", "NVIDIA H100 80GB HBM3")
    assert json.loads((tmp_path / "out/compare.json").read_text()) == line


def test_compare_keeps_the_reason_its_line_could_not_be_made(tmp_path: Path) -> None:
    results = tmp_path / "results"
    (results / "e2e_cold.json").mkdir(parents=True)  # unreadable as a file: read as missing
    (results / "e2e_warm.json").write_text('{"a": "not an object"}')
    done = subprocess.run(
        [sys.executable, "-I", str(REPO / "bench/gpu/compare_result.py"), str(results)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    line = json.loads(done.stdout)
    assert done.returncode == 1
    assert line["error"].startswith("compare_result.py: AttributeError")


# --- the tesseract bundle, and pages no run has seen ----------------------------------------------


sys.path.insert(0, str(REPO / "bench/gpu"))
try:
    import fresh_page  # bench/gpu is no package
finally:
    sys.path.remove(str(REPO / "bench/gpu"))


@pytest.mark.skipif(shutil.which("tesseract") is None, reason="needs tesseract here to bundle")
@pytest.mark.timeout(240)
@pytest.mark.slow
def test_the_tesseract_bundle_detects_orientation_with_nothing_of_the_machines(
    tmp_path: Path,
) -> None:
    root = tmp_path / "repo"
    env = dict(os.environ, XZ_LEVEL="0", XZ_THREADS="1")
    subprocess.run(
        ["bash", str(REPO / "bench/gpu/bundle_tesseract.sh"), str(root / ".gpu/tesseract")],
        env=env,
        check=True,
        capture_output=True,
        timeout=200,
    )
    # The GPU machine as env.sh meets it: no tesseract, no tessdata; a few tools only.
    tools = tmp_path / "tools"
    tools.mkdir()
    for name in ("bash", "sh", "mkdir", "rm", "mv", "dirname", "readlink"):
        (tools / name).symlink_to(shutil.which(name))
    (tools / "python3").symlink_to(os.path.realpath(sys.executable))
    home = tmp_path / "unpacked"
    found = subprocess.run(
        ["bash", "-c", f"source {REPO}/bench/gpu/env.sh; command -v tesseract"],
        cwd=root,
        env={"PATH": str(tools), "TESSERACT_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert found.stdout.strip() == str(home / "bin/tesseract"), found.stderr
    # Only the bundle on PATH (not even /usr/bin), and a TESSDATA_PREFIX of the caller ignored.
    bare = {"PATH": str(home / "bin"), "TESSDATA_PREFIX": "/nonexistent"}
    langs = subprocess.run(
        ["tesseract", "--list-langs"], env=bare, capture_output=True, text=True, timeout=60
    )
    assert f'"{home}/tessdata/"' in langs.stdout
    assert langs.stdout.split()[-2:] == ["eng", "osd"]  # the machine's other languages are not read
    turned = tmp_path / "turned.png"
    fresh_page.page("bundle").rotate(90, expand=True).save(turned)
    osd = subprocess.run(
        ["tesseract", str(turned), "-", "--psm", "0", "--dpi", "300"],
        env={**bare, "OMP_THREAD_LIMIT": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Rotate: 90" in osd.stdout, osd.stdout + osd.stderr
    check = subprocess.run(
        [sys.executable, "-c", "from ocrwatch.pages import orientation; orientation.check(True)"],
        cwd=REPO,
        env={"PATH": str(home / "bin"), "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stderr


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("tesseract") is None, reason="the dry run reads with tesseract")
@pytest.mark.timeout(240)
def test_the_urgent_page_is_read_not_answered_by_duplicate_reuse(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    (corpus / "docs").mkdir(parents=True)
    fresh_page.write(corpus / "doc300.pdf", "the long document")
    work, out = tmp_path / "work", tmp_path / "out"
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench/gpu/e2e.py"),
            "--engine",
            "tesseract",
            "--label",
            "dry",
            "--corpus",
            str(corpus),
            "--work",
            str(work),
            "--out",
            str(out),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--port",
            str(free_port()),
            "--phases",
            "solo,d",
            "--d-after",
            "0",
            "--dpi",
            "150",  # the pages read sooner; the drops are what this is about
            "--timeout",
            "180",
        ],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=230,
    )
    sidecars = {
        n: json.loads((work / "urgent" / f"{n}.pdf.json").read_text()) for n in ("solo", "urgent")
    }
    assert "reused_from" not in sidecars["urgent"], done.stdout[-2000:]
    assert sidecars["urgent"]["source"]["sha256"] != sidecars["solo"]["source"]["sha256"]
    assert all(s["pages"][0]["orientation"] is not None for s in sidecars.values())
    run = json.loads((out / "e2e_dry.json").read_text())
    assert run["settings"]["rotate_pages"] is True  # as the daemon's own loader resolved it
    assert run["reused_pages"] == 0
