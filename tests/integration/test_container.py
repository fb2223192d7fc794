"""The CPU image built and run as docs/operations.md says, block by block: the blocks marked
``<!-- container-test: NAME -->`` there are the commands run here, as written, but for what a
test must change (``SUBSTITUTED``: the base's temporary tar in the test's folder, a free host port
for the metrics). "build" runs in the repository (a Debian bookworm base made by mmdebstrap from
the machine's own apt sources and ``podman import``-ed, the image built on it: no registry), "run"
and "stop" in the test's folder: a PNG in the bind-mounted inbox, its sidecars out, owned by the
image's user, ``podman stop`` and exit 0. "install" is checked against tests/install_podman.sh,
which CI runs.

Podman keeps everything (images, containers, volumes, its database) in a temporary folder of its
own, named by ``CONTAINERS_CONF`` and ``CONTAINERS_STORAGE_CONF``, so the host's podman and other
runs see nothing of it; that configuration holds only places, so the runtime and the ulimits are
the docs' flags. Base, build and run take 2 to 6 minutes on 2 cores, depending on what else runs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import REPO, sidecars_done, wait_until
from tests.support import docs
from tests.support.ports import free_port

pytestmark = [
    pytest.mark.integration,
    pytest.mark.xdist_group("container"),  # one worker builds once; the other workers run the rest
    pytest.mark.timeout(1200),  # apt and pip inside the build, on a busy 2-core machine
]

DOCS = REPO / "docs" / "operations.md"
BLOCK = re.compile(r"<!-- container-test: (\w+) -->\n```sh\n(.*?)\n```", re.DOTALL)
# What the test changes in a block, and why: each must be in the block as the docs have it.
SUBSTITUTED = {
    "build": {"/tmp/bookworm.tar": "{root}/bookworm.tar"},  # the machine's /tmp is shared
    "run": {"127.0.0.1:9464:9464": "127.0.0.1:{port}:9464"},  # 9464 may be taken
}
IMAGE_UID = 10001  # the Containerfile's default UID
IMAGE = "localhost/ocrwatch:latest"  # the build block's -t ocrwatch
NAME, VOLUME = "ocrwatch", "ocrwatch-state"  # the run block's container and state volume
APT_SOURCES = Path("/etc/apt/sources.list.d/debian.sources")  # the build block's, Debian 12's
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")  # the build block's secret
TOOLS = ("podman", "buildah", "mmdebstrap", "runc")


def commands(name: str, **values: str) -> list[str]:
    """The docs' block ``name``, a command a line (continuations joined, comments left to bash),
    with the test's substitutions made, ``values`` filled into them."""
    block = dict(BLOCK.findall(DOCS.read_text()))[name]
    for written, instead in SUBSTITUTED.get(name, {}).items():
        assert written in block, f"{DOCS}'s {name} block no longer holds {written!r}"
        block = block.replace(written, instead.format(**values))
    return [line for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def test_the_docs_install_what_the_suite_installs() -> None:
    """Step 1 of the docs installs the packages tests/install_podman.sh does (runc named, so apt
    does not pick crun for podman)."""
    [install] = commands("install")
    named = [word for word in install.split("apt-get install", 1)[1].split() if word[0] != "-"]
    script = (REPO / "tests" / "install_podman.sh").read_text()
    listed = re.search(r"^PACKAGES=\((.*)\)$", script, re.MULTILINE)
    assert listed is not None
    assert sorted(named) == sorted(listed.group(1).split())
    assert "runc" in named


class Podman:
    """``podman`` on storage of its own under ``root``; ``seconds``: how long each step took."""

    def __init__(self, root: Path) -> None:
        self.root = root
        storage = root / "storage.conf"
        storage.write_text(
            f'[storage]\ndriver = "overlay"\ngraphroot = "{root}/graph"\nrunroot = "{root}/run"\n'
        )
        containers = root / "containers.conf"
        containers.write_text(f'[engine]\ntmp_dir = "{root}/tmp"\nvolume_path = "{root}/volumes"\n')
        self.env = {
            **os.environ,
            "CONTAINERS_CONF": str(containers),
            "CONTAINERS_STORAGE_CONF": str(storage),
        }
        self.seconds: dict[str, float] = {}

    def __call__(self, *argv: str, timeout: float = 120, check: bool = True) -> str:
        done = subprocess.run(
            ["podman", *argv],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"podman {' '.join(argv)}: exit {done.returncode}\n"
                f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
            )
        return done.stdout

    def logs(self, name: str) -> str:
        """The container's output, stdout and stderr together (ocrwatch logs to stderr)."""
        done = subprocess.run(
            ["podman", "logs", name],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=60,
            check=False,
        )
        return done.stdout

    def block(self, name: str, cwd: Path, timeout: float, **values: str) -> list[str]:
        """Run the docs' block ``name`` in ``cwd``, a command at a time with bash (as a user
        pastes it), each one's time kept; what each printed."""
        said = []
        for index, command in enumerate(commands(name, **values)):
            step = f"{name}[{index}]"
            started = time.monotonic()
            log = self.root / f"{step}.log"
            with open(log, "wb") as out:
                done = subprocess.run(
                    ["bash", "-euo", "pipefail", "-c", command],
                    cwd=cwd,
                    env={**self.env, "PWD": str(cwd)},
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=timeout,
                    check=False,
                )
            self.seconds[step] = round(time.monotonic() - started, 1)
            output = log.read_text(errors="replace")
            assert done.returncode == 0, (
                f"{step}: {command}: exit {done.returncode}\n{output[-6000:]}"
            )
            said.append(output)
        return said

    def clean(self) -> None:
        """Remove every container and image, then the folder (overlay mounts first)."""
        self("rm", "--all", "--force", "--volumes", check=False)
        self("rmi", "--all", "--force", check=False)
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
        for point in sorted((m for m in mounts if m.startswith(str(self.root))), reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)
        shutil.rmtree(self.root, ignore_errors=True)


def _unusable() -> str | None:
    """Why the docs' blocks cannot run here, or None: the tools are missing, or this is not root
    (the base is made by mmdebstrap as root), or a file they name is not here."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not installed: run tests/install_podman.sh (as root)"
    if os.geteuid() != 0:
        return "needs root: the base image is made by mmdebstrap and run by rootful podman"
    for needed in (APT_SOURCES, CA_BUNDLE):
        if not needed.exists():
            return f"no {needed}, which the docs' build block names (a Debian 12 host has it)"
    return None


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Podman]:
    """The CPU image, built by the docs' build block: the suite's one build."""
    reason = _unusable()
    if reason:
        pytest.skip(reason)
    podman = Podman(tmp_path_factory.mktemp("podman"))
    try:
        podman.block("build", REPO, timeout=900, root=str(podman.root))
        yield podman
    finally:
        podman.clean()


def inspect(podman: Podman, *what: str) -> Any:
    return json.loads(podman("inspect", *what))[0]


def test_the_image_holds_ocrwatch_not_its_build_inputs(image: Podman) -> None:
    """A non-root user, the two volumes, tini in front of ``ocrwatch run``; no source tree and no CA
    secret left in a layer."""
    config = inspect(image, "--type", "image", IMAGE)["Config"]
    assert config["User"] == "ocrwatch"
    assert set(config["Volumes"]) == {"/inbox", "/state"}
    assert config["Entrypoint"] == ["/usr/bin/tini", "--", "ocrwatch", "run"]
    assert "OCRWATCH_CONFIG=/etc/ocrwatch/config.toml" in config["Env"]
    root = Path(image("image", "mount", IMAGE).strip())
    try:
        assert not (root / "src").exists()
        assert not (root / "run" / "secrets" / "ca").exists()
        assert (root / "etc" / "ocrwatch" / "config.toml").is_file()
        assert f"ocrwatch:x:{IMAGE_UID}:{IMAGE_UID}:" in (root / "etc" / "passwd").read_text()
    finally:
        image("image", "unmount", IMAGE)


def test_the_docs_run_block_takes_a_png_writes_its_sidecars_as_the_images_user_and_stops(
    image: Podman, tmp_path: Path
) -> None:
    """The run block in a folder of the test's: the daemon ready, its metrics on the published
    port, a PNG's sidecars written as uid 10001 beside the source (still root's), the state in
    the volume; the stop block: ``status`` counts the document, ``podman stop`` ends it with 0."""
    port = free_port()
    started = time.monotonic()
    image.block("run", tmp_path, timeout=180, port=str(port))
    try:

        def logged(event: str) -> bool:
            return f'"event": "{event}"' in image.logs(NAME)

        within(image, NAME, lambda: logged("daemon_ready") or _exited(image, NAME), "daemon_ready")
        assert logged("daemon_ready"), image.logs(NAME)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=30) as ready:
            assert ready.status == 200
        top = image("top", NAME, "pid", "user", "args")
        assert any(
            line.split()[:2] == ["1", "ocrwatch"] and "tini" in line for line in top.splitlines()
        ), top
        assert any("ocrwatch run" in line and "tini" not in line for line in top.splitlines()), top

        png = docs.write_png(tmp_path / "inbox" / "scan.png", ["Container test 42", "Sidecars"])
        source = png.read_bytes()
        data = within(image, NAME, lambda: sidecars_done(png), f"sidecars of {png}")
        image.seconds["run"] = round(time.monotonic() - started, 1)
        assert data["status"] == "ok"
        markdown = png.with_name(png.name + ".md")
        assert "Container test 42" in markdown.read_text()
        owners = {path.stat().st_uid for path in (markdown, png.with_name(png.name + ".json"))}
        assert owners == {IMAGE_UID} and png.stat().st_uid == os.getuid()
        assert png.read_bytes() == source
        volume = image("volume", "inspect", "--format", "{{.Mountpoint}}", VOLUME).strip()
        assert (Path(volume) / "ledger.sqlite3").exists(), "the daemon kept its state elsewhere"

        status, _ = image.block("stop", tmp_path, timeout=120)
        assert re.search(r"^done +1$", status, re.MULTILINE), status
        state_of = inspect(image, "--type", "container", NAME)["State"]
        assert (state_of["Status"], state_of["ExitCode"]) == ("exited", 0), image.logs(NAME)
        assert logged("daemon_stopped"), image.logs(NAME)
        print(f"container seconds: {image.seconds}")  # shown with -rP: build, run, stop
    finally:
        image("rm", "--force", "--volumes", NAME, check=False)


def within(podman: Podman, name: str, predicate: Callable[[], Any], what: str) -> Any:
    """``wait_until`` with the container's log in the error."""
    try:
        return wait_until(predicate, 120, what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the container's log:\n{podman.logs(name)}") from None


def _exited(podman: Podman, name: str) -> bool:
    return (
        podman(
            "inspect", "--type", "container", "--format", "{{.State.Status}}", name, check=False
        ).strip()
        == "exited"
    )
