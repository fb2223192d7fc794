"""``ocrwatch check`` as a process: one line per check, ``ok`` or ``FAIL`` with what to do, and a
non-zero exit when anything a start needs is missing or wrong."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from ocrwatch import config
from ocrwatch.app import checks
from ocrwatch.config import S3Config
from ocrwatch.engines import tesseract_checks
from ocrwatch.errors import ConfigError
from tests.support.s3servers import MotoServer, free_port

pytest_plugins = ["tests.support.s3servers"]

REPO = Path(__file__).resolve().parent.parent
# Root writes anywhere; without these capabilities it meets a folder's mode as any user would.
AS_A_USER = (
    ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"] if os.geteuid() == 0 else []
)


def write_config(tmp_path: Path, **changes: Any) -> Path:
    settings: dict[str, Any] = {
        "state_dir": "state",
        "engine": {"kind": "tesseract", "tesseract": {"workers": 1}},
        "metrics": {"listen": f"127.0.0.1:{free_port()}"},
        "inbox": [{"path": "inbox"}],
        **changes,
    }
    path = tmp_path / "ocrwatch.toml"
    path.write_text(tomli_w.dumps(settings))
    path.chmod(0o640)  # as docs/operations.md installs it: secrets are no one else's
    return path


def check(
    config: Path, env: dict[str, str] | None = None, prefix: list[str] | None = None
) -> tuple[int, list[str]]:
    """Exit status and stdout's lines of ``ocrwatch check``; each line must be an ``ok`` or a
    ``FAIL``."""
    proc = subprocess.run(
        [*(prefix or []), sys.executable, "-m", "ocrwatch", "check", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=config.parent,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )
    lines = proc.stdout.splitlines()
    assert lines and all(line.startswith(("ok   ", "FAIL ")) for line in lines), (
        proc.stdout + proc.stderr
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    # the table only
    assert not [line for line in proc.stderr.splitlines() if line.startswith("{")], proc.stderr
    return proc.returncode, lines


def failures(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("FAIL")]


def test_a_machine_with_everything_passes_with_a_line_per_check(tmp_path: Path) -> None:
    code, lines = check(
        write_config(tmp_path, inbox=[{"path": "inbox", "lang": "eng"}], output={"dir": "out"})
    )
    assert code == 0 and not failures(lines), lines
    said = "\n".join(lines)
    for expected in (
        "ok   pdfinfo ",
        "ok   pdftoppm ",
        "ok   prlimit ",
        "ok   tesseract ",
        "ok   [engine.tesseract] lang auto picks by each page's script among ",
        "ok   inbox[0].lang eng",
        "ok   engine tesseract recognised a test page",
        "ok   inbox[0].path ",
        f"ok   [output] dir {tmp_path / 'out'}",
        "ok   state_dir ",
        "ok   [metrics] listen ",
    ):
        assert expected in said, said
    assert not (tmp_path / "inbox").exists() and not (tmp_path / "out").exists(), (
        "check created a folder"
    )


def test_pdftoppm_missing_from_path(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("pdfinfo", "tesseract", "prlimit"):
        (bin_dir / tool).symlink_to(shutil.which(tool) or tool)
    code, lines = check(write_config(tmp_path), env={"PATH": str(bin_dir)})
    assert code != 0
    assert failures(lines) == [
        "FAIL pdftoppm: not found on PATH: install poppler-utils (apt-get install poppler-utils)"
    ]


def test_language_data_missing(tmp_path: Path) -> None:
    code, lines = check(write_config(tmp_path, inbox=[{"path": "inbox", "lang": "deu+zzz"}]))
    assert code != 0
    [failed] = failures(lines)
    assert failed.startswith("FAIL inbox[0].lang deu+zzz: tesseract has no language data for zzz")
    assert failed.endswith(": install tesseract-ocr-zzz, or change inbox[0].lang")


def test_a_lang_given_on_the_command_line_is_checked_by_the_same_rule(tmp_path: Path) -> None:
    """``ocrwatch ocr --lang``: the language check of ``check`` and of a start, naming the option,
    not the file."""
    cfg = config.load(write_config(tmp_path))
    checks.require_languages(cfg, "eng")
    with pytest.raises(ConfigError) as raised:
        checks.require_languages(cfg, "eng+zzz")
    assert raised.value.message.startswith(
        "--lang eng+zzz: tesseract has no language data for zzz (installed: "
    )
    assert raised.value.hint == "install tesseract-ocr-zzz, or change --lang"
    with pytest.raises(ConfigError) as raised:
        checks.require_languages(cfg, "eng+")
    assert raised.value.hint == "name languages as eng or eng+deu, or change --lang"


def test_lang_auto_looks_for_the_fallback_and_osd_not_a_language_named_auto(
    tmp_path: Path,
) -> None:
    """``lang = "auto"``, the default: no language named auto is looked for; the page's script
    is, which orientation detection finds with OSD's data. With rotation off, auto is still a
    start (it is the default) and its line says every page is read in eng."""
    cfg = config.load(write_config(tmp_path))
    assert cfg.engine.tesseract.lang == "auto"
    checks.require_languages(cfg, "auto")
    off = cfg.model_copy(update={"render": cfg.render.model_copy(update={"rotate_pages": False})})
    checks.require_languages(off, "auto")
    [line] = tesseract_checks._auto("--lang", frozenset({"eng"}), False).line().splitlines()
    assert line.startswith("ok   --lang auto reads every page in eng: orientation detection")
    assert not tesseract_checks._auto("--lang", frozenset({"eng"}), True).ok  # no osd data
    assert not tesseract_checks._auto("--lang", frozenset({"deu"}), False).ok  # no eng


def test_a_busy_metrics_port(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, lines = check(write_config(tmp_path, metrics={"listen": f"127.0.0.1:{port}"}))
    assert code != 0
    [failed] = failures(lines)
    assert failed.startswith(f"FAIL [metrics] listen 127.0.0.1:{port}: address already in use: ")


def test_a_start_names_every_problem_check_finds_not_only_the_first(tmp_path: Path) -> None:
    """A busy metrics port hid missing language data that ``check`` listed: ``preflight``, which
    refuses ``run``'s start, names both, in ``check``'s order, with both fixes."""
    (tmp_path / "inbox").mkdir()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        path = write_config(
            tmp_path,
            state_dir=str(tmp_path / "state"),
            metrics={"listen": f"127.0.0.1:{port}"},
            inbox=[{"path": str(tmp_path / "inbox"), "lang": "eng+zzz"}],
        )
        _, lines = check(path)
        with pytest.raises(ConfigError) as raised:
            checks.preflight(config.load(path))
    said = raised.value.message.splitlines()
    assert len(said) == len(failures(lines)) == 2, (said, lines)
    assert said[0].startswith(f"{path}: [metrics] listen 127.0.0.1:{port}: address already in use")
    assert said[1].startswith(f"{path}: inbox[0].lang eng+zzz: tesseract has no language data")
    assert "set [metrics] listen to a free HOST:PORT" in raised.value.hint
    assert "install tesseract-ocr-zzz" in raised.value.hint


@pytest.mark.parametrize("chosen", ["variable", "file"])
def test_vllm_that_does_not_import_is_told_how_to_choose_tesseract_where_vllm_was_chosen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chosen: str
) -> None:
    """The hint of ``check``'s "vllm does not import" line names what chose vLLM, as ``ocr``'s does:
    the variable when the environment chose it, never the file's key the file does not hold."""
    monkeypatch.setitem(sys.modules, "vllm", None)  # its import fails, installed or not
    path = write_config(tmp_path, engine={"kind": "vllm" if chosen == "file" else "tesseract"})
    environ = {"OCRWATCH_ENGINE_KIND": "vllm"} if chosen == "variable" else {}
    found = {
        result.what: result for result in checks._engine(config.load(path, environ), probe=True)
    }
    assert not found["vllm"].ok and found["vllm"].detail.startswith("does not import: ")
    instead = {
        "variable": "OCRWATCH_ENGINE_KIND=tesseract in the environment",
        "file": f"[engine] kind = 'tesseract' in {path}",
    }[chosen]
    assert found["vllm"].hint is not None
    assert found["vllm"].hint.endswith(f"or choose Tesseract: {instead}")


@pytest.fixture
def read_only_inbox(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: a folder's mode cannot stop this process")
    inbox = tmp_path / "inbox"
    inbox.mkdir(mode=0o555)
    (tmp_path / "state").mkdir()
    yield inbox
    inbox.chmod(0o755)


def test_an_inbox_the_user_cannot_write(tmp_path: Path, read_only_inbox: Path) -> None:
    """Sidecars go beside the documents, so the inbox must be writable; with ``[output] dir`` it
    need not be."""
    code, lines = check(write_config(tmp_path), prefix=AS_A_USER)
    assert code != 0
    [failed] = failures(lines)
    assert failed.startswith(f"FAIL inbox[0].path {read_only_inbox}: permission denied: create ")
    code, lines = check(write_config(tmp_path, output={"dir": "out"}), prefix=AS_A_USER)
    assert code == 0, lines
    assert any(
        line.startswith(f"ok   inbox[0].path {read_only_inbox} is readable") for line in lines
    ), lines
    assert list(read_only_inbox.iterdir()) == []


def test_archive_dir_is_checked_as_a_quarantine_is(tmp_path: Path) -> None:
    """Writable where it exists, else creatable in the nearest folder above it: the first move makes
    it."""
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: a folder's mode cannot stop this process")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    moving = {"on_success": "move", "archive_dir": str(locked / "archive")}
    try:
        code, lines = check(
            write_config(tmp_path, output=moving, inbox=[{"path": "in"}]), prefix=AS_A_USER
        )
    finally:
        locked.chmod(0o755)
    assert code != 0
    [failed] = failures(lines)
    assert failed.startswith(
        f"FAIL [output] archive_dir {locked}/archive: cannot be created in {locked}: "
        "permission denied: "
    ), failed
    code, lines = check(
        write_config(tmp_path, output=moving, inbox=[{"path": "in"}]), prefix=AS_A_USER
    )
    assert code == 0, lines
    assert f"ok   [output] archive_dir {locked}/archive does not exist yet; " in "\n".join(lines), (
        lines
    )
    (locked / "archive").mkdir()
    code, lines = check(
        write_config(tmp_path, output=moving, inbox=[{"path": "in"}]), prefix=AS_A_USER
    )
    assert f"ok   [output] archive_dir {locked}/archive is writable by " in "\n".join(lines), lines


def test_s3_endpoints_probed_even_without_a_bucket(tmp_path: Path, moto: MotoServer) -> None:
    """An endpoint that is down fails; one that answers gives an ``ok`` line per probe that ran,
    whether a bucket is configured (webhook with none) or not."""
    down = {
        "transport": "webhook",
        "token": "t",
        "listen": f"127.0.0.1:{free_port()}",
        "endpoint_url": f"http://127.0.0.1:{free_port()}",
        "region": "us-east-1",
        "access_key_id": "testing",
        "secret_access_key": "testing",
    }
    code, lines = check(write_config(tmp_path, s3=[down]))
    assert code != 0
    [failed] = failures(lines)
    assert failed.startswith(f"FAIL s3[0] endpoint {down['endpoint_url']}: cannot be reached: ")
    assert "testing" not in failed

    queue = moto.bucket_with_queue("scans", "events")
    webhook = moto.s3_config(transport="webhook", token="t", listen=f"127.0.0.1:{free_port()}")
    sqs = moto.s3_config(queue_url=queue, bucket="scans", output_bucket="ocr-out")
    code, lines = check(write_config(tmp_path, s3=[webhook, sqs]))
    said = "\n".join(lines)
    assert (
        f"ok   s3[0] endpoint {moto.endpoint} answered; credentials accepted (1 bucket(s) visible)"
        in said
    )
    assert f"ok   s3[0].listen {webhook['listen']} is free" in said
    assert (
        f"ok   s3[1] queue {queue} answered" in said and "ok   s3[1] bucket scans answered" in said
    )
    assert failures(lines) == [
        "FAIL s3[1] bucket ocr-out: 404 (Not Found): create the bucket, or correct its name"
    ]
    assert code != 0


@pytest.mark.s3
def test_s3_probes_name_a_missing_queue_a_missing_bucket_and_a_queue_without_dead_letters(
    moto: MotoServer,
) -> None:
    """The probes of one ``[[s3]]`` table, each its own line: what answered, and what is wrong with
    what."""
    queue = moto.bucket_with_queue("docs", "events")
    good = list(checks._s3(0, S3Config(queue_url=queue, bucket="docs", **moto.s3_config())))
    assert [r.ok for r in good] == [True, True, True], good
    bad = list(
        checks._s3(
            0,
            S3Config(
                queue_url=queue.replace("events", "nope"), bucket="missing", **moto.s3_config()
            ),
        )
    )
    assert [(r.ok, "queue" in r.what, "missing" in r.what) for r in bad] == [
        (True, False, False),
        (False, True, False),
        (False, False, True),
    ], bad
    [_, dead] = checks._s3(
        0, S3Config(queue_url=queue, on_max_receives="dead_letter", **moto.s3_config())
    )
    assert not dead.ok and "RedrivePolicy" in dead.detail


def test_a_state_dir_others_may_write(tmp_path: Path) -> None:
    """The daemon would refuse to start on it (the ledger could be replaced): check says so, and
    how."""
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o777)
    code, lines = check(write_config(tmp_path))
    assert code != 0
    [failed] = failures(lines)
    assert failed.startswith(f"FAIL state_dir {state}: is writable by others (mode 0777)"), failed
    assert failed.endswith(f": chmod 700 {state}"), failed
