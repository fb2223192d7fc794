"""Configuration: defaults that work, errors that name the file and the key, exit code 2 from the CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ocrwatch import config
from ocrwatch.engines.deepseek.options import SamplingRung, VllmConfig
from ocrwatch.engines.sampling import Sampling
from ocrwatch.engines.tesseract_options import TesseractConfig
from ocrwatch.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent


def test_defaults_need_no_file() -> None:
    cfg = config.Config()
    assert cfg.state_dir == Path(".ocrwatch")
    assert cfg.engine.kind == "auto"
    assert cfg.inbox[0].path == Path("inbox")
    assert cfg.output.name_template == "{name}"
    assert cfg.metrics.listen.startswith("127.0.0.1:")


def test_example_file_is_valid_and_documents_every_key() -> None:
    example = REPO / "config.example.toml"
    cfg = config.load(example)
    text = example.read_text()
    for section, model in (
        ("render", config.RenderConfig), ("limits", config.LimitsConfig), ("output", config.OutputConfig),
        ("log", config.LogConfig), ("metrics", config.MetricsConfig), ("scheduler", config.SchedulerConfig),
        ("retry", config.RetryConfig), ("daemon", config.DaemonConfig), ("engine", config.EngineConfig),
        ("engine.tesseract", TesseractConfig), ("engine.vllm", VllmConfig),
        ("inbox", config.InboxConfig), ("s3", config.S3Config),
    ):
        for key in model.model_fields:
            if key in ("vllm", "tesseract"):
                continue
            assert f"{key} =" in text or f"# {key} =" in text, f"config.example.toml does not document {section}.{key}"
    assert cfg.engine.kind == "auto"


def test_the_sampling_defaults_are_the_engine_contracts() -> None:
    default, vllm, rung = Sampling(), VllmConfig(), SamplingRung()
    assert (vllm.max_tokens, vllm.ngram_size, vllm.window_size) == (4096, 30, 90)
    assert (vllm.max_tokens, vllm.ngram_size, vllm.window_size) == (default.max_tokens, default.ngram_size,
                                                                    default.window_size)  # fmt: skip
    assert (rung.temperature, rung.ngram_size, rung.window_size) == (0.0, 30, 90) == (
        default.temperature, default.ngram_size, default.window_size
    )


def test_render_dpi_unset_means_the_engines_own(tmp_path: Path) -> None:
    assert config.Config().render.dpi is None
    assert config.load(write(tmp_path, "[render]\ndpi = 300\n")).render.dpi == 300


def test_a_source_without_a_priority_gets_the_default_lane() -> None:
    assert config.DEFAULT_PRIORITY == 50 and config.InboxConfig().priority == config.DEFAULT_PRIORITY
    s3 = config.S3Config(queue_url="https://sqs.example/q")
    assert s3.priority == config.DEFAULT_PRIORITY


def test_the_engine_kind_is_auto_or_an_installed_engine(tmp_path: Path) -> None:
    for kind in ("auto", "vllm", "tesseract", "plugin"):
        assert config.load(write(tmp_path, f"[engine]\nkind = '{kind}'\n")).engine.kind == kind
    with pytest.raises(ConfigError, match="unknown engine 'gpu'.*installed: auto, plugin, tesseract, vllm"):
        config.load(write(tmp_path, "[engine]\nkind = 'gpu'\n"))


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "ocrwatch.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[render]\ndpi = 5\n", "render.dpi"),
        ("[render]\ndpy = 300\n", "render.dpy"),
        ("[engine]\nkind = 'gpu'\n", "engine.kind"),
        ("[[inbox]]\npath = 'x'\nprompt = 'nope'\n", "inbox[0].prompt"),
        ("[output]\nname_template = '../{name}'\n", "output.name_template"),
        ("[[s3]]\ntransport = 'webhook'\n", "s3[0].token"),
        ("[limits]\nmax_pages = -1\n", "limits.max_pages"),
        ("[engine.vllm]\nreplica_processes = 'sometimes'\n", "engine.vllm.replica_processes"),
    ],
)
def test_errors_name_file_and_key(tmp_path: Path, text: str, needle: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        config.load(path)
    assert str(path) in info.value.message
    assert needle in info.value.message


def test_not_toml(tmp_path: Path) -> None:
    path = write(tmp_path, "[render\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        config.load(path)


def test_relative_paths_are_relative_to_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "state_dir = 'state'\n[[inbox]]\npath = 'in'\n")
    cfg = config.load(path)
    assert cfg.state_dir == tmp_path / "state"
    assert cfg.inbox[0].path == tmp_path / "in"


def test_frozen() -> None:
    cfg = config.Config()
    with pytest.raises(Exception):
        cfg.state_dir = Path("/elsewhere")  # type: ignore[misc]


def test_cli_exit_code_2_on_invalid_config(tmp_path: Path) -> None:
    path = write(tmp_path, "[render]\ndpi = 'high'\n")
    proc = subprocess.run(
        [sys.executable, "-m", "ocrwatch", "ocr", "--config", str(path), str(path)], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "render.dpi" in proc.stderr and str(path) in proc.stderr


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", False),
        ("replicas = 2", True),
        ("replicas = 2\nreplica_processes = false", False),
        ("replica_processes = true", True),
        ("replicas = 1\nreplica_processes = 'auto'", False),
    ],
)
def test_replica_processes_auto_means_several_replicas(tmp_path: Path, text: str, expected: bool) -> None:
    cfg = config.load(write(tmp_path, f"[engine.vllm]\n{text}\n"))
    assert cfg.engine.vllm.in_processes is expected


def test_a_relative_output_dir_is_relative_to_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "etc"
    folder.mkdir()
    monkeypatch.chdir(tmp_path)  # not the file's folder
    cfg = config.load(write(folder, "[output]\ndir = 'out'\n"))
    assert cfg.output.dir == folder / "out"
    assert config.load(write(folder, "[output]\ndir = '/srv/out'\n")).output.dir == Path("/srv/out")


def test_an_inbox_lang_is_tesseract_languages_found_by_its_folder(tmp_path: Path) -> None:
    cfg = config.load(write(tmp_path, "[[inbox]]\npath = 'de'\nlang = 'deu+eng'\n[[inbox]]\npath = 'en'\n"))
    assert cfg.inbox_lang(tmp_path / "de") == "deu+eng"
    assert cfg.inbox_lang(tmp_path / "en") is None  # [engine.tesseract] lang
    assert cfg.inbox[0].lang == "deu+eng" and config.load(write(tmp_path, "[[inbox]]\nlang = 'script/Latin'\n"))
    for bad in ("", "-psm 0", "eng+", "deu eng", "../eng"):
        with pytest.raises(ConfigError, match=r"inbox\[0\]\.lang"):
            config.load(write(tmp_path, f"[[inbox]]\nlang = '{bad}'\n"))


@pytest.mark.parametrize(
    ("first", "second", "inner", "outer"),
    [
        ("in", "in/sub", 1, 0), ("in/sub/deeper", "in", 0, 1), ("in", "link/sub", 1, 0),
        ("in/../in/sub", "in", 0, 1),
    ],
)
def test_an_inbox_inside_a_recursive_inbox_is_refused_naming_both(
    tmp_path: Path, first: str, second: str, inner: int, outer: int
) -> None:  # fmt: skip
    (tmp_path / "in" / "sub").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "in")  # hides the nesting until paths are resolved
    path = write(tmp_path, f"[[inbox]]\npath = '{first}'\n[[inbox]]\npath = '{second}'\n")
    with pytest.raises(ConfigError) as info:
        config.load(path)
    message = info.value.message
    assert str(path) in message and "processed twice" in message
    assert f"inbox[{inner}].path ({tmp_path / 'in' / 'sub'}" in message
    assert f"inbox[{outer}].path ({tmp_path / 'in'})" in message


def test_inboxes_side_by_side_or_below_a_flat_one_are_accepted(tmp_path: Path) -> None:
    siblings = config.load(write(tmp_path, "[[inbox]]\npath = 'in'\n[[inbox]]\npath = 'in2'\n"))
    assert [inbox.path for inbox in siblings.inbox] == [tmp_path / "in", tmp_path / "in2"]
    flat = "[[inbox]]\npath = 'in'\nrecursive = false\n[[inbox]]\npath = 'in/sub'\n"
    assert len(config.load(write(tmp_path, flat)).inbox) == 2  # the outer one never looks into sub
