"""The CPU image (Containerfile) built and run as a user would, with no registry: a Debian
bookworm base made by mmdebstrap from the machine's own apt sources and ``podman import``-ed, the
image built from the repository, a container on a bind-mounted inbox: a PNG in, its sidecars out,
``podman stop`` and exit 0.

Podman keeps everything (images, containers, its database) in a temporary folder of its own, named
by ``CONTAINERS_CONF`` and ``CONTAINERS_STORAGE_CONF``, so the host's podman and other runs see
nothing of it. The runtime is runc: crun refuses some hosts' cgroup layouts (cgroup v1 with a v2
``unified`` mount). The ulimits stay below a sandbox's own (a container may not raise them). The
build reaches apt and PyPI through the host's network, with the host's CA bundle as a build secret
(a TLS-intercepting proxy's certificate stays out of the image). Base, build and run take 2 to 6
minutes on 2 cores, depending on what else runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import docs
from tests.integration.conftest import REPO, sidecars_done, wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.xdist_group("container"),  # one worker builds once; the other workers run the rest
    pytest.mark.timeout(1200),  # apt and pip inside the build, on a busy 2-core machine
]

IMAGE_UID = 10001  # the Containerfile's default UID
BASE = "localhost/ocrwatch-test-base:bookworm"
IMAGE = "localhost/ocrwatch-test:latest"
APT_SOURCES = (Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list"))
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
TOOLS = ("podman", "buildah", "mmdebstrap", "runc")


class Podman:
    """``podman`` on storage of its own under ``root``; ``seconds``: how long each step took."""

    def __init__(self, root: Path) -> None:
        self.root = root
        storage = root / "storage.conf"
        storage.write_text(
            f'[storage]\ndriver = "overlay"\ngraphroot = "{root}/graph"\nrunroot = "{root}/run"\n'
        )
        containers = root / "containers.conf"
        containers.write_text(
            "[containers]\n"
            'default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]\n'
            "[engine]\n"
            'runtime = "runc"\n'
            'cgroup_manager = "cgroupfs"\n'
            'events_logger = "file"\n'
            f'tmp_dir = "{root}/tmp"\n'
            f'volume_path = "{root}/volumes"\n'
        )
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

    def timed(self, step: str, argv: list[str], timeout: float) -> None:
        """Run ``argv`` (a build step) with podman's environment, its time kept as ``step``."""
        started = time.monotonic()
        log = self.root / f"{step}.log"
        with open(log, "wb") as out:
            done = subprocess.run(
                argv,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                check=False,
            )
        self.seconds[step] = round(time.monotonic() - started, 1)
        tail = log.read_text(errors="replace")[-6000:]
        assert done.returncode == 0, f"{step}: {' '.join(argv)}: exit {done.returncode}\n{tail}"

    def clean(self) -> None:
        """Remove every container and image, then the folder (overlay mounts first)."""
        self("rm", "--all", "--force", "--volumes", check=False)
        self("rmi", "--all", "--force", check=False)
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
        for point in sorted((m for m in mounts if m.startswith(str(self.root))), reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)
        shutil.rmtree(self.root, ignore_errors=True)


def _unusable() -> str | None:
    """Why podman cannot build and run here, or None: the tools are missing, or this is not root
    (the base is made by mmdebstrap as root; rootless podman needs subuid ranges set up)."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not installed: run tests/install_podman.sh (as root)"
    if os.geteuid() != 0:
        return "needs root: the base image is made by mmdebstrap and run by rootful podman"
    if not any(path.exists() for path in APT_SOURCES):
        return "no apt sources file for mmdebstrap to make the Debian base from"
    return None


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Podman]:
    """The CPU image, built from the repository on a base made here."""
    reason = _unusable()
    if reason:
        pytest.skip(reason)
    podman = Podman(tmp_path_factory.mktemp("podman"))
    try:
        sources = next(path for path in APT_SOURCES if path.exists())
        rootfs = podman.root / "rootfs.tar"
        base = [
            "mmdebstrap",
            "--variant=apt",
            "--format=tar",
            "bookworm",
            str(rootfs),
            str(sources),
        ]
        podman.timed("base", base, timeout=600)
        podman("import", str(rootfs), BASE, timeout=300)
        rootfs.unlink()
        secret = ["--secret", f"id=ca,src={CA_BUNDLE}"] if CA_BUNDLE.exists() else []
        build = [
            "podman",
            "build",
            "--network",
            "host",
            "--build-arg",
            f"BASE={BASE}",
            *secret,
            "--tag",
            IMAGE,
            "--file",
            str(REPO / "Containerfile"),
            str(REPO),
        ]
        podman.timed("build", build, timeout=900)
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


def test_a_png_in_the_bind_mounted_inbox_gets_its_sidecars_and_stop_exits_0(
    image: Podman, tmp_path: Path
) -> None:
    inbox, state = tmp_path / "inbox", tmp_path / "state"
    for folder in (inbox, state):
        folder.mkdir()
        os.chown(folder, IMAGE_UID, IMAGE_UID)  # as the README says: the image's user writes them
    name = f"ocrwatch-test-{uuid.uuid4().hex[:12]}"
    started = time.monotonic()
    image(
        "run",
        "--detach",
        "--name",
        name,
        "--network",
        "none",
        "--volume",
        f"{inbox}:/inbox",
        "--volume",
        f"{state}:/state",
        IMAGE,
    )
    try:

        def logged(event: str) -> bool:
            return f'"event": "{event}"' in image.logs(name)

        within(image, name, lambda: logged("daemon_ready") or _exited(image, name), "daemon_ready")
        assert logged("daemon_ready"), image.logs(name)
        top = image("top", name, "pid", "user", "args")
        assert any(
            line.split()[:2] == ["1", "ocrwatch"] and "tini" in line for line in top.splitlines()
        ), top
        assert any("ocrwatch run" in line and "tini" not in line for line in top.splitlines()), top

        png = docs.write_png(inbox / "scan.png", ["Container test 42", "Sidecars come out"])
        source = png.read_bytes()
        data = within(image, name, lambda: sidecars_done(png), f"sidecars of {png}")
        image.seconds["run"] = round(time.monotonic() - started, 1)
        assert data["status"] == "ok"
        markdown = png.with_name(png.name + ".md").read_text()
        assert "Container test 42" in markdown
        assert png.with_name(png.name + ".md").stat().st_uid == IMAGE_UID
        assert png.read_bytes() == source
        assert any(state.iterdir()), "the daemon kept its state outside /state"

        image("stop", "--time", "60", name, timeout=90)
        state_of = inspect(image, "--type", "container", name)["State"]
        assert (state_of["Status"], state_of["ExitCode"]) == ("exited", 0), image.logs(name)
        assert logged("daemon_stopped"), image.logs(name)
        print(f"container seconds: {image.seconds}")  # shown with -rP: base, build, run
    finally:
        image("rm", "--force", "--volumes", name, check=False)


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
