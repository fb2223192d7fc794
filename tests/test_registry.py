"""Engine selection (``auto`` and its reason), the ``ocrwatch.engines`` entry points, building each
kind, plugins, and the fault engines' contract."""

from __future__ import annotations

import importlib.util
import sys
import types
from importlib.metadata import Distribution, EntryPoint, PackageNotFoundError, entry_points
from pathlib import Path

import pytest

import ocrwatch.config.engines as config_engines
from ocrwatch.config import EngineConfig
from ocrwatch.engines import registry
from ocrwatch.engines.base import Engine, EngineSpec
from ocrwatch.errors import ConfigError
from tests.support import fault_engines


def fake_module(name: str, **attributes: object) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attributes)
    return module


def fake_torch(devices: int) -> types.ModuleType:
    cuda = types.SimpleNamespace(is_available=lambda: devices > 0, device_count=lambda: devices)
    return fake_module("torch", cuda=cuda)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_auto_without_vllm_is_tesseract_and_says_why() -> None:
    kind, reason = registry.choose(EngineConfig())
    assert kind == "tesseract"
    assert "vllm is not installed" in reason and "Tesseract" in reason


def test_auto_with_vllm_and_a_cuda_device_is_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", fake_module("vllm", __version__="0.26.0"))
    monkeypatch.setitem(sys.modules, "torch", fake_torch(2))
    kind, reason = registry.choose(EngineConfig())
    assert kind == "vllm"
    assert "vllm 0.26.0" in reason and "2 CUDA device(s)" in reason


def test_auto_with_vllm_but_no_cuda_device_is_tesseract(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", fake_module("vllm", __version__="0.33.0"))
    monkeypatch.setitem(sys.modules, "torch", fake_torch(0))
    kind, reason = registry.choose(EngineConfig())
    assert kind == "tesseract"
    assert "no CUDA device is visible" in reason


def test_auto_with_a_broken_vllm_is_tesseract(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("raise RuntimeError('driver too old')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    kind, reason = registry.choose(EngineConfig())
    assert kind == "tesseract"
    assert "vllm does not import: RuntimeError: driver too old" in reason


def test_an_explicit_kind_is_taken_as_configured() -> None:
    assert registry.choose(EngineConfig(kind="vllm")) == (
        "vllm",
        "[engine] kind = 'vllm' in the configuration",
    )
    assert registry.choose(EngineConfig(kind="tesseract"))[0] == "tesseract"


def test_the_reason_names_the_flag_the_variable_or_the_file_that_chose_the_engine(
    tmp_path: Path,
) -> None:
    """What ``engine_selected`` logs: never the file for a choice ``ocrwatch ocr``'s flags or a
    variable made."""
    from ocrwatch import config
    from ocrwatch.app.cli import _ocr_config, _parser

    path = tmp_path / "ocrwatch.toml"
    path.write_text("[engine]\nkind = 'vllm'\n")
    cfg = config.load(path, {})

    def reason(cfg: config.Config) -> str:
        return registry.choose(cfg.engine, registry.chosen_by(cfg))[1]

    assert reason(cfg) == f"[engine] kind = 'vllm' in {path}"
    variable = config.load(path, {"OCRWATCH_ENGINE_KIND": "tesseract"})
    assert reason(variable) == "OCRWATCH_ENGINE_KIND=tesseract in the environment"
    for flags, said in (
        (["--engine", "tesseract"], "--engine tesseract on the command line"),
        (["--lang", "deu"], "--lang deu on the command line (Tesseract's languages)"),
    ):
        assert reason(_ocr_config(cfg, _parser().parse_args(["ocr", *flags, "x.pdf"]))) == said


def test_build_vllm_needs_no_vllm_until_started() -> None:
    engine = registry.build(EngineConfig(), "drop", kind="vllm")
    from ocrwatch.engines.deepseek.engine import VllmEngine

    assert isinstance(engine, VllmEngine) and isinstance(engine, Engine)
    assert engine.images == "drop"
    assert engine.max_concurrency == 128


def test_build_tesseract() -> None:
    engine = registry.build(EngineConfig(kind="tesseract"))
    assert engine.name == "tesseract" and isinstance(engine, Engine)


def test_build_refuses_an_unknown_kind() -> None:
    with pytest.raises(ConfigError, match="unknown engine"):
        registry.build(EngineConfig(), kind="quantum")


def test_load_plugin_builds_a_fault_engine_from_keyword_arguments() -> None:
    engine = registry.load_plugin(
        "tests.support.fault_engines:CrashingEngine", {"every": 5, "delay": 0.1}
    )
    assert isinstance(engine, fault_engines.CrashingEngine)
    assert (engine.every, engine.delay) == (5, 0.1)


@pytest.mark.parametrize(
    ("spec", "args", "message"),
    [
        ("tests.support.fault_engines", {}, "module:attribute"),
        ("tests.no_such_module:Engine", {}, "cannot load"),
        ("tests.support.fault_engines:NoSuchEngine", {}, "cannot load"),
        ("tests.support.fault_engines:EchoEngine", {"colour": "blue"}, "rejects"),
        ("tests.support.fault_engines:reset_crash_count", {}, "did not build an engine"),
    ],
)
def test_load_plugin_explains_what_is_wrong(
    spec: str, args: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        registry.load_plugin(spec, args)


@pytest.mark.skipif(
    "plugin" not in EngineConfig.model_fields, reason="EngineConfig has no plugin fields yet"
)
def test_build_plugin_from_the_config() -> None:
    cfg = EngineConfig.model_validate(
        {
            "kind": "plugin",
            "plugin": "tests.support.fault_engines:LoopingEngine",
            "plugin_args": {"mode": "always"},
        }
    )
    assert registry.choose(cfg)[0] == "plugin"
    engine = registry.build(cfg)
    assert isinstance(engine, fault_engines.LoopingEngine) and engine.mode == "always"


@pytest.mark.parametrize(
    "engine",
    [
        fault_engines.EchoEngine(),
        fault_engines.CrashingEngine(),
        fault_engines.HangingEngine(),
        fault_engines.LoopingEngine(),
    ],
    ids=lambda engine: engine.name,
)
def test_fault_engines_honour_the_engine_protocol(engine: Engine) -> None:
    assert isinstance(engine, Engine)
    assert engine.max_concurrency >= 1 and engine.geometry.dpi > 0
    assert engine.describe()["name"] == engine.name


def test_gpu_count_reads_the_driver_folder_or_the_device_nodes(tmp_path: Path) -> None:
    proc, dev = tmp_path / "gpus", tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "null"):
        (dev / name).touch()
    # a container: nodes, no /proc/driver/nvidia
    assert registry.gpu_count(str(proc), str(dev)) == 2
    proc.mkdir()
    for bus in ("0000:17:00.0", "0000:3d:00.0", "0000:63:00.0"):
        (proc / bus).mkdir()
    assert registry.gpu_count(str(proc), str(dev)) == 3
    assert registry.gpu_count(str(tmp_path / "none"), str(tmp_path / "none")) == 0


def test_the_built_in_engines_are_entry_points_like_any_other() -> None:
    for kind in ("tesseract", "vllm", "plugin"):
        spec = registry.find(kind)
        assert isinstance(spec, EngineSpec) and spec.name == kind


def test_the_built_in_engines_are_found_through_entry_points_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Installed, ocrwatch's own entry points name them; a checkout run without being installed
    reads the same entry points from its pyproject.toml. Listed in the order ``auto`` tries them."""
    found = {entry.name: entry.value for entry in entry_points(group="ocrwatch.engines")}
    assert {"vllm", "tesseract", "plugin"} <= found.keys()
    assert config_engines.built_in() == ["vllm", "tesseract", "plugin"]

    def uninstalled(name: str) -> Distribution:
        raise PackageNotFoundError(name)

    monkeypatch.setattr(config_engines, "distribution", uninstalled)
    monkeypatch.setattr(config_engines, "entry_points", lambda **select: [])
    assert config_engines.names() == ["vllm", "tesseract", "plugin"]
    assert config_engines.value("vllm") == found["vllm"]


def _cannot_run() -> tuple[bool, str]:
    return False, "eager needs a quantum chip"


EAGER = EngineSpec("eager", lambda *_: fault_engines.EchoEngine(), auto=-2, runs_here=_cannot_run)
KEEN = EngineSpec("keen", lambda *_: fault_engines.EchoEngine(), auto=-1)


def test_auto_tries_the_engines_in_the_order_their_specs_declare(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``auto`` names no engine: each spec says its place and whether it can run here. One that
    cannot is passed over with its reason (warned of where it is installed); the first that can
    runs; another package's engines are listed after ocrwatch's own."""
    listed = [
        EntryPoint(name=name, value=f"tests.test_registry:{name.upper()}", group="ocrwatch.engines")
        for name in ("keen", "eager")
    ]

    def registered(**select: str) -> list[EntryPoint]:
        return [entry for entry in listed if select.get("name") in (None, entry.name)]

    monkeypatch.setattr(config_engines, "entry_points", registered)
    assert config_engines.names() == ["vllm", "tesseract", "plugin", "eager", "keen"]
    kind, reason = registry.choose(EngineConfig())
    assert kind == "keen"
    assert reason == "[engine] kind = 'auto': eager needs a quantum chip, so keen runs here"
    assert registry.fell_back(EngineConfig(), kind)
    listed.remove(listed[0])
    monkeypatch.setitem(sys.modules, "vllm", fake_module("vllm", __version__="0.33.0"))
    monkeypatch.setitem(sys.modules, "torch", fake_torch(0))
    kind, reason = registry.choose(EngineConfig())
    assert kind == "tesseract" and reason == (
        "[engine] kind = 'auto': eager needs a quantum chip; vllm 0.33.0 imports but no CUDA "
        "device is visible, so Tesseract runs on the CPU"
    )


def test_an_entry_point_that_names_no_engine_spec_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from importlib.metadata import EntryPoint

    bogus = EntryPoint(
        name="bogus", value="tests.support.fault_engines:EchoEngine", group="ocrwatch.engines"
    )
    monkeypatch.setattr(
        config_engines,
        "entry_points",
        lambda **select: [bogus] if select.get("name") in ("bogus", None) else [],
    )
    with pytest.raises(ConfigError, match="does not name an EngineSpec"):
        registry.build(EngineConfig(), kind="bogus")


def test_each_built_in_spec_brings_its_options_checks_and_languages() -> None:
    """The spec, not ``checks.py``, knows an engine: Tesseract reads its installed language data,
    vLLM takes no language, and each validates its own table."""
    from ocrwatch.config import Config
    from ocrwatch.engines.deepseek.options import VllmConfig
    from ocrwatch.engines.tesseract_options import TesseractConfig

    tesseract, vllm = registry.find("tesseract"), registry.find("vllm")
    assert (tesseract.options, vllm.options) == (TesseractConfig, VllmConfig)
    assert tesseract.languages is not None and "eng" in tesseract.languages(TesseractConfig())
    assert vllm.languages is None
    said = [check.what for check in tesseract.checks(Config(), False, [("--lang", "eng+xyz")])]
    assert said == ["tesseract", "--lang eng+xyz"]
    found = tesseract.checks(Config(), False, [("--lang", "eng")])
    assert [check.ok for check in found] == [True, True]
