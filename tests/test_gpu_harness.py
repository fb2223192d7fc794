"""The GPU harness on the CPU: a step cannot outlive its deadline or hold the caller's output, and
compare.sh ends within its BUDGET with its JSON line whatever its steps do.

The failures these stand for were seen on the device: a step piped through ``tee | grep`` waited for
vLLM's engine-core child, which outlives its killed parent and holds the pipe, and compare.sh did
not return for more than ten minutes after its last measurement.
"""

from __future__ import annotations

import json
import os
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
        timeout=budget + 30,
    )
    seconds = time.monotonic() - started
    assert seconds <= budget + 5, done.stdout[-2000:]
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
