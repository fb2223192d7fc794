"""Configuration: defaults that work, errors that name the file and the key, exit code 2 from the
CLI."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

import ocrwatch.config.env as config_env
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
        ("render", config.RenderConfig),
        ("limits", config.LimitsConfig),
        ("output", config.OutputConfig),
        ("log", config.LogConfig),
        ("metrics", config.MetricsConfig),
        ("scheduler", config.SchedulerConfig),
        ("retry", config.RetryConfig),
        ("daemon", config.DaemonConfig),
        ("engine", config.EngineConfig),
        ("engine.tesseract", TesseractConfig),
        ("engine.vllm", VllmConfig),
        ("inbox", config.InboxConfig),
        ("s3", config.S3Config),
    ):
        for key in model.model_fields:
            if key in ("vllm", "tesseract"):
                continue
            assert f"{key} =" in text or f"# {key} =" in text, (
                f"config.example.toml does not document {section}.{key}"
            )
    assert cfg.engine.kind == "auto"


def test_the_sampling_defaults_are_the_engine_contracts() -> None:
    default, vllm, rung = Sampling(), VllmConfig(), SamplingRung()
    assert (vllm.max_tokens, vllm.ngram_size, vllm.window_size) == (4096, 30, 90)
    assert (vllm.max_tokens, vllm.ngram_size, vllm.window_size) == (
        default.max_tokens,
        default.ngram_size,
        default.window_size,
    )
    assert (
        (rung.temperature, rung.ngram_size, rung.window_size)
        == (0.0, 30, 90)
        == (default.temperature, default.ngram_size, default.window_size)
    )


def test_render_dpi_unset_means_the_engines_own(tmp_path: Path) -> None:
    assert config.Config().render.dpi == "auto"
    assert config.load(write(tmp_path, '[render]\ndpi = "auto"\n')).render.dpi == "auto"
    assert config.load(write(tmp_path, "[render]\ndpi = 300\n")).render.dpi == 300


def test_a_source_without_a_priority_gets_the_default_lane() -> None:
    assert (
        config.DEFAULT_PRIORITY == 50 and config.InboxConfig().priority == config.DEFAULT_PRIORITY
    )
    s3 = config.S3Config(queue_url="https://sqs.example/q")
    assert s3.priority == config.DEFAULT_PRIORITY


def test_the_engine_kind_is_auto_or_an_installed_engine(tmp_path: Path) -> None:
    for kind in ("auto", "vllm", "tesseract", "plugin"):
        assert config.load(write(tmp_path, f"[engine]\nkind = '{kind}'\n")).engine.kind == kind
    with pytest.raises(
        ConfigError, match="unknown engine 'gpu'.*installed: auto, plugin, tesseract, vllm"
    ):
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


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            "[output]\nsearchable_pfd = true\n",
            "output.searchable_pfd: no such key (did you mean `searchable_pdf`?)",
        ),
        ("stat_dir = 'x'\n", "stat_dir: no such key (did you mean `state_dir`?)"),
        (
            "[[inbox]]\npath = 'x'\npatern = ['*.pdf']\n",
            "inbox[0].patern: no such key (did you mean `patterns`?)",
        ),
        ("[engine.vllm]\nmodle = 'x'\n", "engine.vllm.modle: no such key (did you mean `model`?)"),
        ("[engine.vlm]\nmodel = 'x'\n", "engine.vlm: no such key (did you mean `vllm`?)"),
        ("[render]\nxyzzy = 1\n", "render.xyzzy: no such key\n"),
    ],
)
def test_an_unknown_key_in_the_file_is_told_the_nearest_key_of_its_table(
    tmp_path: Path, text: str, said: str
) -> None:
    """As an unknown variable is told the nearest variable: a typo reads as one, not as the
    validator's "Extra inputs are not permitted"."""
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        config.load(path, {})
    assert f"{info.value.message}\n".startswith(f"{path}: {said}"), info.value.message


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
    with pytest.raises(ValidationError):
        cfg.state_dir = Path("/elsewhere")  # type: ignore[misc]


def test_cli_exit_code_2_on_invalid_config(tmp_path: Path) -> None:
    path = write(tmp_path, "[render]\ndpi = 'high'\n")
    proc = subprocess.run(
        [sys.executable, "-m", "ocrwatch", "ocr", "--config", str(path), str(path)],
        capture_output=True,
        text=True,
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
def test_replica_processes_auto_means_several_replicas(
    tmp_path: Path, text: str, expected: bool
) -> None:
    cfg = config.load(write(tmp_path, f"[engine.vllm]\n{text}\n"))
    assert cfg.engine.vllm.in_processes is expected


def test_a_relative_output_dir_is_relative_to_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "etc"
    folder.mkdir()
    monkeypatch.chdir(tmp_path)  # not the file's folder
    cfg = config.load(write(folder, "[output]\ndir = 'out'\n"))
    assert cfg.output.dir == folder / "out"
    assert config.load(write(folder, "[output]\ndir = '/srv/out'\n")).output.dir == Path("/srv/out")


def test_an_inbox_lang_is_tesseract_languages_found_by_its_folder(tmp_path: Path) -> None:
    cfg = config.load(
        write(tmp_path, "[[inbox]]\npath = 'de'\nlang = 'deu+eng'\n[[inbox]]\npath = 'en'\n")
    )
    assert cfg.inbox_lang(tmp_path / "de") == "deu+eng"
    assert cfg.inbox_lang(tmp_path / "en") is None  # [engine.tesseract] lang
    assert cfg.inbox[0].lang == "deu+eng" and config.load(
        write(tmp_path, "[[inbox]]\nlang = 'script/Latin'\n")
    )
    for bad in ("", "-psm 0", "eng+", "deu eng", "../eng"):
        with pytest.raises(ConfigError, match=r"inbox\[0\]\.lang"):
            config.load(write(tmp_path, f"[[inbox]]\nlang = '{bad}'\n"))


@pytest.mark.parametrize(
    ("first", "second", "inner", "outer"),
    [
        ("in", "in/sub", 1, 0),
        ("in/sub/deeper", "in", 0, 1),
        ("in", "link/sub", 1, 0),
        ("in/../in/sub", "in", 0, 1),
    ],
)
def test_an_inbox_inside_a_recursive_inbox_is_refused_naming_both(
    tmp_path: Path, first: str, second: str, inner: int, outer: int
) -> None:
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


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[[inbox]]\nrecursive = 'yes'\n", "inbox[0].recursive: Input should be a valid boolean"),
        ("[[inbox]]\nrecursive = 1\n", "inbox[0].recursive: Input should be a valid boolean"),
        ("[[inbox]]\nmax_depth = 2.0\n", "inbox[0].max_depth: Input should be a valid integer"),
        ("[[inbox]]\npatterns = '*.pdf'\n", "inbox[0].patterns: Input should be a valid array"),
        (
            "[render]\ntimeout_seconds = '2.5'\n",
            "render.timeout_seconds: Input should be a valid number",
        ),
        ("[metrics]\nenabled = 'false'\n", "metrics.enabled: Input should be a valid boolean"),
        ("[engine.vllm]\nseed = '7'\n", "engine.vllm.seed: Input should be a valid integer"),
        ("state_dir = 5\n", "state_dir: Input should be a valid"),
        ("[render]\ndpi = 1979-05-27\n", "render.dpi: a date or time, which no key takes"),
    ],
)
def test_values_are_taken_as_strictly_as_toml_types_them(
    tmp_path: Path, text: str, needle: str
) -> None:
    """ "yes" is text and 2.0 a float, as TOML itself says: neither is taken for a boolean or a
    count."""
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        config.load(path, {})
    assert f"{path}: {needle}" in info.value.message


def test_an_integer_is_taken_for_a_float_and_text_for_a_path(tmp_path: Path) -> None:
    cfg = config.load(
        write(tmp_path, "[render]\ntimeout_seconds = 3\n[[inbox]]\npath = 'in'\n"), {}
    )
    assert cfg.render.timeout_seconds == 3.0 and cfg.inbox[0].path == tmp_path / "in"
    assert cfg.inbox[0].patterns == config.InboxConfig().patterns  # an array read as the tuple


@pytest.mark.parametrize("name", ["inbox", "s3", "hook"])
def test_a_table_written_for_an_array_of_tables_says_which_to_write(
    tmp_path: Path, name: str
) -> None:
    path = write(tmp_path, f"[{name}]\npath = 'x'\n")
    with pytest.raises(ConfigError) as info:
        config.load(path, {})
    assert (
        info.value.message == f"{path}: {name}: use [[{name}]], not [{name}]: an array of tables,"
        f" one [[{name}]] each"
    )


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[output]\non_success = 'move'\n", "output.on_success: 'move' needs [output] archive_dir"),
        (
            "[[inbox]]\non_success = 'move'\n",
            "inbox[0].on_success: 'move' needs [output] archive_dir",
        ),
        (
            "[output]\non_success = 'move'\narchive_dir = 'a'\n[[s3]]\nqueue_url = 'q'\n",
            "output.on_success: 'move' needs s3[0].archive_prefix",
        ),
        (
            "[[s3]]\nqueue_url = 'q'\non_success = 'move'\n",
            "s3[0].on_success: 'move' needs s3[0].archive_prefix",
        ),
    ],
)
def test_a_move_without_its_archive_is_reported_against_the_key_written(
    tmp_path: Path, text: str, needle: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        config.load(path, {})
    assert info.value.message == f"{path}: {needle}"


def test_a_buckets_prompt_is_checked_as_an_inboxs_is(tmp_path: Path) -> None:
    """An unknown preset would fail every document of the bucket in ``prompt_text``: it stops the
    start."""
    path = write(tmp_path, "[[s3]]\nqueue_url = 'q'\nprompt = 'nope'\n")
    with pytest.raises(ConfigError, match=r"s3\[0\]\.prompt: unknown preset 'nope'"):
        config.load(path, {})
    own = '[engine.vllm]\nprompts = {mine = "<image>\\nRead it."}\n'
    own += "[[s3]]\nqueue_url = 'q'\nprompt = 'mine'\n"
    cfg = config.load(write(tmp_path, own), {})
    assert cfg.prompt_text(cfg.s3[0].prompt) == "<image>\nRead it."


# --- configuration by environment -----------------------------------------------------------------


def test_variables_set_keys_over_the_file(tmp_path: Path) -> None:
    text = (
        "state_dir = 'state'\n[engine.tesseract]\nlang = 'eng'\n[[inbox]]\npath = "
        "'in'\npriority = 10\n"
    )
    hook = tmp_path / "post.sh"
    hook.write_text("#!/bin/sh\n")
    hook.chmod(0o755)
    env = {
        "OCRWATCH_STATE_DIR": "/srv/state",
        "OCRWATCH_ENGINE_KIND": "tesseract",
        "OCRWATCH_ENGINE_TESSERACT_LANG": "deu+eng",
        "OCRWATCH_ENGINE_PLUGIN_ARGS": "{ size = 3 }",
        "OCRWATCH_RENDER_DPI": "200",
        "OCRWATCH_RENDER_TIMEOUT_SECONDS": "2.5",
        "OCRWATCH_INBOX_0_RECURSIVE": "false",
        "OCRWATCH_INBOX_0_POLLING": "auto",
        "OCRWATCH_INBOX_0_PATTERNS": '["*.pdf"]',
        "OCRWATCH_INBOX_1_PATH": str(tmp_path / "second"),
        "OCRWATCH_ENGINE_VLLM_LADDER_1_TEMPERATURE": "0.3",
        "OCRWATCH_S3_0_QUEUE_URL": "https://sqs.example/q",
        "OCRWATCH_S3_0_BUCKET": "2024",  # text, as written: the key is text
        "OCRWATCH_HOOK_0_COMMAND": f'["{hook}", "--now"]',
    }
    cfg = config.load(write(tmp_path, text), env)
    assert cfg.state_dir == Path("/srv/state")
    assert (cfg.engine.kind, cfg.engine.tesseract.lang, cfg.engine.plugin_args) == (
        "tesseract",
        "deu+eng",
        {"size": 3},
    )
    assert (cfg.render.dpi, cfg.render.timeout_seconds) == (200, 2.5)
    first, second = cfg.inbox
    assert (first.path, first.priority) == (tmp_path / "in", 10)
    assert (first.recursive, first.polling) == (False, "auto")
    assert first.patterns == ("*.pdf",) and second.path == tmp_path / "second" and second.recursive
    default = VllmConfig().ladder  # one rung changed, the other kept
    assert cfg.engine.vllm.ladder == (
        default[0],
        default[1].model_copy(update={"temperature": 0.3}),
    )
    assert (cfg.s3[0].queue_url, cfg.s3[0].bucket) == ("https://sqs.example/q", "2024")
    assert cfg.hook[0].command == (str(hook), "--now") and cfg.hook[0].name == "post.sh"


def test_variables_without_a_file_change_the_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no ./ocrwatch.toml here
    cfg = config.load(None, {"OCRWATCH_INBOX_0_PATH": "/data/inbox", "OCRWATCH_LOG_LEVEL": "debug"})
    assert [inbox.path for inbox in cfg.inbox] == [Path("/data/inbox")] and cfg.log.level == "debug"
    assert cfg.inbox[0].recursive and cfg.state_dir == Path(".ocrwatch")
    assert config.load(None, {}) == config.Config()


OTHERS = {
    "OCRWATCH_CONFIG": "",
    "OCRWATCH_CORPUS": "/x",
    "OCRWATCH_STATUS": "ok",
    "OCRWATCH_SOURCE": "file:///x",
    "OCRWATCH_ORIGINAL": "file:///y",
    "OCRWATCH_JSON": "/x.json",
    "OCRWATCH_MD": "",
    "OCRWATCH_LANES": "1",
}


def test_variables_ocrwatch_uses_otherwise_are_no_keys(tmp_path: Path) -> None:
    """A hook's own variables, or the engine's, reach a daemon or a command a hook starts: not
    keys."""
    assert set(OTHERS) <= config_env.OTHER_USES
    documented = (REPO / "config.example.toml").read_text()
    assert all(name in documented for name in config_env.OTHER_USES), (
        "config.example.toml lists them all"
    )
    assert config.load(write(tmp_path, ""), OTHERS) == config.load(write(tmp_path, ""), {})


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        (
            {"OCRWATCH_INBOX_0_RECURSIVE": "yes"},
            "OCRWATCH_INBOX_0_RECURSIVE: Input should be a valid boolean",
        ),
        ({"OCRWATCH_RENDER_DPI": "high"}, "OCRWATCH_RENDER_DPI: Input should be a valid integer"),
        ({"OCRWATCH_RENDER_DPI": "300.0"}, "OCRWATCH_RENDER_DPI: Input should be a valid integer"),
        ({"OCRWATCH_RENDER_DPI": "1979-05-27"}, "OCRWATCH_RENDER_DPI: a date or time"),
        ({"OCRWATCH_ENGINE_KIND": "gpu"}, "OCRWATCH_ENGINE_KIND: unknown engine 'gpu'"),
        (
            {"OCRWATCH_INBOX_0_PATTERNS": '["*.pdf", 3]'},
            "OCRWATCH_INBOX_0_PATTERNS[1]: Input should be a valid",
        ),
        (
            {"OCRWATCH_METRICS_ENABLED": "true\nx = 1"},
            "OCRWATCH_METRICS_ENABLED: Input should be a valid",
        ),
        (
            {"OCRWATCH_OUTPUT_ON_SUCCESS": "move"},
            "OCRWATCH_OUTPUT_ON_SUCCESS: 'move' needs [output]",
        ),
        ({"OCRWATCH_S3_0_PROMPT": "nope"}, "OCRWATCH_S3_0_PROMPT: unknown preset 'nope'"),
        (
            {"OCRWATCH_ENGNE_KIND": "x"},
            "OCRWATCH_ENGNE_KIND: no such key (did you mean OCRWATCH_ENGINE_KIND?)",
        ),
        (
            {"OCRWATCH_ENGINE": "{}"},
            "OCRWATCH_ENGINE: names a table, not a key: set each key, e.g.",
        ),
        ({"OCRWATCH_INBOX_2_PATH": "/x"}, "OCRWATCH_INBOX_2_PATH: inbox has 1 table(s)"),
        ({"OCRWATCH_INBOX_01_PATH": "/x"}, "OCRWATCH_INBOX_01_PATH: no such key"),
        (
            {"OCRWATCH_ENGINE_TESSERACT_LANGS": "deu"},
            "did you mean OCRWATCH_ENGINE_TESSERACT_LANG?",
        ),
    ],
)
def test_a_variables_fault_names_the_variable(
    tmp_path: Path, env: dict[str, str], needle: str
) -> None:
    with pytest.raises(ConfigError) as info:
        config.load(
            write(tmp_path, "[[s3]]\nqueue_url = 'q'\n" if "S3" in next(iter(env)) else ""), env
        )
    assert info.value.message.startswith("environment: ") and needle in info.value.message


def test_every_unknown_variable_is_named(tmp_path: Path) -> None:
    env = {"OCRWATCH_ENGNE_KIND": "x", "OCRWATCH_RENDER_DPY": "300", "OCRWATCH_LOG_LEVEL": "debug"}
    with pytest.raises(ConfigError) as info:
        config.load(write(tmp_path, ""), env)
    lines = info.value.message.splitlines()
    assert [line.split(":")[1].strip() for line in lines] == [
        "OCRWATCH_ENGNE_KIND",
        "OCRWATCH_RENDER_DPY",
    ]


def test_a_nesting_from_a_variable_names_it_and_the_files_key(tmp_path: Path) -> None:
    (tmp_path / "in" / "sub").mkdir(parents=True)
    path = write(tmp_path, "[[inbox]]\npath = 'in'\n")
    with pytest.raises(ConfigError) as info:
        config.load(path, {"OCRWATCH_INBOX_1_PATH": str(tmp_path / "in" / "sub")})
    said = (
        f"environment: OCRWATCH_INBOX_1_PATH ({tmp_path / 'in' / 'sub'}) lies inside inbox[0].path"
    )
    assert info.value.message.startswith(f"{said} ({tmp_path / 'in'})")


def test_every_key_has_one_variable_of_its_own() -> None:
    """Names are derived from the model: no two keys share one, and each reads back as its key."""
    found = list(config_env.names(config.Config))
    variables = [config_env.PREFIX + name for name, _ in found]
    assert len(set(variables)) == len(variables) > 100
    assert not set(variables) & config_env.OTHER_USES
    for variable, (_, loc) in zip(variables, found, strict=True):
        assert config_env.overlay({}, config.Config, {variable: "1"}) == {loc: variable}
    assert ("OCRWATCH_ENGINE_VLLM_MAX_NUM_SEQS", ("engine", "vllm", "max_num_seqs")) in zip(
        variables, [loc for _, loc in found], strict=True
    )


def test_every_ocrwatch_variable_in_the_repository_is_a_key_or_another_use() -> None:
    """A new variable ocrwatch sets or reads must join ``OTHER_USES``, or every daemon that inherits
    it refuses to start; and a variable a file of the repository sets (a unit, an image) must be a
    key."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=True
    )
    files = listed.stdout
    keys = {config_env.PREFIX + name for name, _ in config_env.names(config.Config)}
    for name in files.split("\0"):
        path = REPO / name
        if name == "tests/test_config.py" or not path.is_file():  # this file names faulty variables
            continue
        for variable in set(
            re.findall(r"OCRWATCH_[A-Z0-9][A-Z0-9_]*", path.read_text(errors="replace"))
        ):
            indexed = re.sub(r"_[1-9][0-9]*_", "_0_", variable)
            assert variable in config_env.OTHER_USES or indexed in keys, f"{name}: {variable}"


def test_the_cli_names_a_faulty_variable_and_exits_2(tmp_path: Path) -> None:
    env = {**os.environ, "OCRWATCH_INBOX_0_RECURSIVE": "yes", "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "ocrwatch", "status", "--config", str(write(tmp_path, ""))]
    proc = subprocess.run(command, capture_output=True, text=True, env=env)
    assert proc.returncode == 2
    assert "environment: OCRWATCH_INBOX_0_RECURSIVE: Input should be a valid boolean" in proc.stderr


def test_the_sqs_receive_backoff_is_a_key_of_its_bucket(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[[s3]]\nqueue_url = "q"\nreceive_backoff_max_seconds = 5\n')
    assert config.load(path, environ={}).s3[0].receive_backoff_max_seconds == 5
    assert config.S3Config(queue_url="q").receive_backoff_max_seconds == 30.0
    path.write_text('[[s3]]\nqueue_url = "q"\nreceive_backoff_max_seconds = 0\n')
    with pytest.raises(ConfigError, match=r"s3\[0\]\.receive_backoff_max_seconds"):
        config.load(path, environ={})


@pytest.mark.parametrize("key", ["render_ahead", "render_workers", "max_active_documents"])
def test_automatic_is_spelled_auto_and_the_old_zero_is_refused(tmp_path: Path, key: str) -> None:
    path = tmp_path / "c.toml"
    assert getattr(config.Config().scheduler, key) == "auto"
    path.write_text(f'[scheduler]\n{key} = "auto"\n')
    assert getattr(config.load(path, environ={}).scheduler, key) == "auto"
    path.write_text(f"[scheduler]\n{key} = 3\n")
    assert getattr(config.load(path, environ={}).scheduler, key) == 3
    path.write_text(f"[scheduler]\n{key} = 0\n")
    said = rf'scheduler\.{key}: 0 no longer means automatic: write "auto"'
    with pytest.raises(ConfigError, match=said):
        config.load(path, environ={})
    variable = f"OCRWATCH_SCHEDULER_{key.upper()}"
    assert getattr(config.load(None, environ={variable: "auto"}).scheduler, key) == "auto"
    with pytest.raises(ConfigError, match=rf"{variable}: 0 no longer means automatic"):
        config.load(None, environ={variable: "0"})


def test_tesseract_workers_automatic_is_auto_and_zero_is_refused(tmp_path: Path) -> None:
    assert TesseractConfig().workers == "auto"
    path = tmp_path / "c.toml"
    path.write_text("[engine.tesseract]\nworkers = 0\n")
    said = r"engine\.tesseract\.workers: 0 no longer means automatic"
    with pytest.raises(ConfigError, match=said):
        config.load(path, environ={})


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('[render]\ndpi = "high"\n', 'render.dpi: Input should be a valid integer, or "auto"'),
        (
            "[render]\ndpi = 10\n",
            'render.dpi: Input should be greater than or equal to 50, or "auto"',
        ),
        (
            '[[inbox]]\npolling = "maybe"\n',
            'inbox[0].polling: Input should be a valid boolean, or "auto"',
        ),
    ],
)
def test_a_key_that_also_takes_auto_fails_in_one_line(tmp_path: Path, text: str, said: str) -> None:
    with pytest.raises(ConfigError) as info:
        config.load(write(tmp_path, text), environ={})
    assert info.value.message == f"{tmp_path / 'ocrwatch.toml'}: {said}"


# --- paths and secrets: the trust rule (ocrwatch.config.roots) applied to the configuration
# ------------


@pytest.mark.parametrize(
    ("text", "env", "said"),
    [
        ('state_dir = ""\n', {}, "{file}: state_dir: an empty path"),
        ('[[inbox]]\npath = ""\n', {}, "{file}: inbox[0].path: an empty path"),
        ('[output]\ndir = ""\n', {}, "{file}: output.dir: an empty path"),
        ("", {"OCRWATCH_STATE_DIR": ""}, "environment: OCRWATCH_STATE_DIR: an empty"),
        ("", {"OCRWATCH_INBOX_0_PATH": ""}, "environment: OCRWATCH_INBOX_0_PATH: an"),
        (
            "",
            {"OCRWATCH_INBOX_0_QUARANTINE_DIR": ""},
            "environment: OCRWATCH_INBOX_0_QUARANTINE_DIR: an empty path",
        ),
    ],
)
def test_an_empty_path_is_refused_not_taken_for_the_working_folder(
    tmp_path: Path, text: str, env: dict[str, str], said: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        config.load(path, env)
    assert info.value.message.startswith(said.format(file=path)), info.value.message
    dot = config.load(write(tmp_path, text.replace('""', '"."')), {key: "." for key in env})
    # "." says the working folder (the file's, in the file), where it is meant
    assert {Path("."), tmp_path} & {
        dot.state_dir,
        dot.inbox[0].path,
        dot.inbox[0].quarantine_dir,
        dot.output.dir,
    }


def test_a_key_is_named_as_the_user_set_it(tmp_path: Path) -> None:
    cfg = config.load(write(tmp_path, "[output]\ndir = 'out'\n"), {"OCRWATCH_STATE_DIR": "/s"})
    assert cfg.key(("state_dir",)) == "OCRWATCH_STATE_DIR"
    assert cfg.key(("output", "dir")) == "[output] dir"
    assert cfg.key(("inbox", 0, "path")) == "inbox[0].path"
    by_key = {root.key: root for root in cfg.roots()}
    assert by_key["OCRWATCH_STATE_DIR"].where == "environment"
    assert by_key["[output] dir"].where == str(tmp_path / "ocrwatch.toml")


@pytest.mark.parametrize("mode", [0o666, 0o646, 0o662])
def test_a_configuration_others_may_write_is_refused_naming_the_fix(
    tmp_path: Path, mode: int
) -> None:
    path = write(tmp_path, "")
    path.chmod(mode)
    with pytest.raises(ConfigError) as info:
        config.load(path, {})
    assert f"config {path}: is writable by others (mode {mode:04o})" in info.value.message
    assert info.value.hint == f"chmod 0640 {path}"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")
def test_a_configuration_of_another_user_or_through_a_link_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "")
    os.chown(path, 65534, 65534)
    with pytest.raises(ConfigError, match="is owned by nobody, not by root"):
        config.load(path, {})
    os.chown(path, 0, 0)
    (tmp_path / "link.toml").symlink_to(path)
    with pytest.raises(ConfigError, match="symbolic link"):
        config.load(tmp_path / "link.toml", {})


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")
@pytest.mark.parametrize(
    ("owner", "mode", "taken"),
    [((0, 0), 0o644, True), ((65534, 65534), 0o644, False), ((0, 0), 0o666, False)],
)
def test_an_implicit_file_in_the_working_folder_is_taken_only_when_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, owner: tuple[int, int], mode: int, taken: bool
) -> None:
    """Another user's ``./ocrwatch.toml`` (left in a shared inbox) is passed over with a line and
    the search goes on; ``$OCRWATCH_CONFIG`` or ``--config`` names a file outright."""
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, "[log]\nlevel = 'debug'\n")
    os.chown(path, *owner)
    path.chmod(mode)
    found, passed_over = config.discover({})
    if taken:
        assert (found, passed_over) == (Path("ocrwatch.toml"), [])
        assert config.load(None, {}).log.level == "debug"
        return
    assert found != Path("ocrwatch.toml")
    [said] = passed_over
    assert said.startswith(f"ocrwatch: {path} passed over, not read: ") and "--config" in said
    assert config.load(None, {}).log.level == "info"
    assert config.discover({"OCRWATCH_CONFIG": str(path)}) == (path, [])


def test_a_secret_is_read_from_its_file_at_start(tmp_path: Path) -> None:
    secret, token = tmp_path / "s3-secret", tmp_path / "hook-token"
    secret.write_text("s3cr3t\nsecond line ignored\n")
    token.write_text("t0ken")
    for path in (secret, token):
        path.chmod(0o600)
    text = (
        f'[[s3]]\nqueue_url = "https://sqs.example/q"\nsecret_access_key_file = "{secret}"\n'
        f'[[hook]]\nurl = "http://127.0.0.1:1/"\ntoken_file = "{token}"\n'
    )
    cfg = config.load(write(tmp_path, text), {})
    assert (cfg.s3[0].secret_access_key, cfg.hook[0].token) == (None, None)
    read = cfg.with_secrets()
    assert (read.s3[0].secret_access_key, read.hook[0].token) == ("s3cr3t", "t0ken")
    assert "s3cr3t" not in repr(read) and "t0ken" not in repr(read)
    token.chmod(0o666)
    with pytest.raises(ConfigError) as info:
        cfg.with_secrets()
    assert f"hook[0].token_file {token}: is writable by others" in info.value.message


def test_a_webhook_token_from_a_file_and_the_table_secrets_once(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t\n")
    webhook = '[[s3]]\ntransport = "webhook"\n'
    assert config.load(write(tmp_path, webhook + f'token_file = "{token}"\n'), {}).s3[0].token_file
    for text, said in (
        (webhook, "s3[0].token: required with transport 'webhook'"),
        (webhook + f'token = "t"\ntoken_file = "{token}"\n', "give token or token_file, not both"),
        (webhook + 'token_file = "token"\n', "s3[0].token_file: an absolute path"),
        (
            '[[hook]]\ncommand = ["true"]\ntoken_file = "/x"\n',
            "hook[0].token_file: only for a url hook",
        ),
    ):
        with pytest.raises(ConfigError, match=re.escape(said)):
            config.load(write(tmp_path, text), {})


def test_the_secrets_a_configuration_holds_are_the_files_own(tmp_path: Path) -> None:
    """What the warning of secrets others may read names: the file's inline secrets, not those of
    the environment or of a ``*_file``, nor an AMQP URL without a password."""
    text = (
        '[[s3]]\nqueue_url = "https://sqs.example/q"\nsecret_access_key = "k"\n'
        '[[hook]]\nurl = "http://127.0.0.1:1/"\ntoken = "t"\n'
    )
    cfg = config.load(write(tmp_path, text), {})
    [held] = [root for root in cfg.roots() if root.key == "config"]
    assert held.secrets == "s3[0].secret_access_key, hook[0].token"
    cfg = config.load(write(tmp_path, text), {"OCRWATCH_S3_0_SECRET_ACCESS_KEY": "k"})
    [held] = [root for root in cfg.roots() if root.key == "config"]
    assert held.secrets == "hook[0].token"
