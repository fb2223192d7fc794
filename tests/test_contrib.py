"""contrib/: the Grafana dashboard and the Prometheus alert rules query only series the daemon
exports.

Every PromQL expression in both files is reduced to the metric names it reads, and each name must be
a sample name of a real scrape of ``ocrwatch run`` (Tesseract engine, metrics on a free port). With
promtool installed (Debian's ``prometheus`` package), the expressions are also parsed by Prometheus
itself and the alerts are run against synthetic series: each fires on its failure and stays quiet on
a healthy daemon.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import REPO, DaemonProcess

DASHBOARD = REPO / "contrib" / "grafana" / "ocrwatch-dashboard.json"
ALERTS = REPO / "contrib" / "prometheus" / "alerts.yml"

SYNTHESISED = {"up"}
"""Series Prometheus writes itself for each target; no exporter serves them."""

_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENTIFIER = re.compile(r"(?<![\w:.$])([A-Za-z_:][\w:]*)(\s*\()?")
_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
}
_LABEL_VALUES = re.compile(
    r"^\s*label_values\(\s*(?:([A-Za-z_:][\w:]*)\s*(?:\{[^}]*\})?\s*,)?\s*\w+\s*\)\s*$"
)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression (or a Grafana ``label_values`` query) reads: identifiers
    that are neither functions, keywords, label names (in matchers or in ``by (...)`` lists) nor
    Grafana variables."""
    if match := _LABEL_VALUES.match(expr):
        return {match.group(1)} if match.group(1) else set()
    expr = _STRINGS.sub('""', expr)
    expr = re.sub(r"\{[^}]*\}", "{}", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "[]", expr)  # ranges and subqueries, with their $__rate_interval
    expr = _LABEL_LISTS.sub("", expr)
    expr = re.sub(r"\$\{?\w+\}?", "", expr)
    return {name for name, call in _IDENTIFIER.findall(expr) if not call and name not in _KEYWORDS}


def alert_rules() -> list[dict[str, Any]]:
    return [
        rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]
    ]


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def dashboard_panels() -> list[dict[str, Any]]:
    return [panel for panel in dashboard()["panels"] if panel["type"] != "row"]


def dashboard_queries() -> list[str]:
    queries = [target["expr"] for panel in dashboard_panels() for target in panel["targets"]]
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            queries.append(variable["query"]["query"])
    return queries


def test_the_tokenizer_finds_series_and_nothing_else() -> None:
    expr = (
        "histogram_quantile(0.95, sum by (le, stage) "
        '(rate(ocrwatch_stage_seconds_bucket{instance=~"$instance",'
        ' stage!="x"}[$__rate_interval]))) / on (job) group_left(version) ocrwatch_build_info > 1e3'
        " and deriv(process_open_fds[30m:1m] offset 5m) > 0.5 or up == 0 unless vector(1)"
    )
    assert metric_names(expr) == {
        "ocrwatch_stage_seconds_bucket",
        "ocrwatch_build_info",
        "process_open_fds",
        "up",
    }
    assert metric_names('label_values(ocrwatch_documents_total{job=~"$job"}, instance)') == {
        "ocrwatch_documents_total"
    }
    assert metric_names("label_values(job)") == set()


def test_the_files_are_well_formed() -> None:
    board = dashboard()
    panels = dashboard_panels()
    ids = [panel["id"] for panel in board["panels"]]
    assert board["uid"] and board["title"] and len(ids) == len(set(ids))
    assert {v["name"] for v in board["templating"]["list"]} == {"datasource", "job", "instance"}
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"] and all(target["expr"].strip() for target in panel["targets"]), (
            panel["title"]
        )
        assert {"h", "w", "x", "y"} <= panel["gridPos"].keys() and panel["gridPos"]["x"] + panel[
            "gridPos"
        ]["w"] <= 24
    rules = alert_rules()
    assert {rule["alert"] for rule in rules} >= {
        "OcrwatchDown",
        "OcrwatchNotReady",
        "OcrwatchQueueStalled",
        "OcrwatchFailureRate",
        "OcrwatchEngineRestartLoop",
    }
    for rule in rules:
        assert (
            rule["labels"]["severity"] in {"warning", "critical"} and rule["annotations"]["summary"]
        ), rule["alert"]


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[set[str]]:
    """Sample names (``_total``, ``_bucket``, ``_sum``, ``_count`` included) of a real daemon's
    /metrics, and the names of the gauges it declares."""
    daemon = DaemonProcess(tmp_path_factory.mktemp("contrib"))
    daemon.start()
    try:
        text = daemon.metrics()
    finally:
        if daemon.stop() != 0:
            daemon.kill()
    families = list(text_string_to_metric_families(text))
    # A labelled gauge with no series yet (ocrwatch_gpu_memory_bytes on a host without a GPU) is
    # still declared, and a gauge's one sample name is its family name.
    yield {sample.name for family in families for sample in family.samples} | {
        family.name for family in families if family.type == "gauge"
    }


@pytest.mark.integration
@pytest.mark.parametrize("source", ["dashboard", "alerts"])
def test_every_queried_metric_is_exported(scraped: set[str], source: str) -> None:
    queries = (
        dashboard_queries() if source == "dashboard" else [rule["expr"] for rule in alert_rules()]
    )
    assert all(metric_names(query) for query in queries), "an expression with no metric in it"
    missing: dict[str, list[str]] = {}
    for query in queries:
        for name in sorted(metric_names(query) - scraped - SYNTHESISED):
            missing.setdefault(name, []).append(" ".join(query.split()))
    assert not missing, "queried but not exported by the daemon:\n" + "\n".join(
        f"  {name}: {len(exprs)} expression(s), e.g. {exprs[0]}" for name, exprs in missing.items()
    )


# --- Prometheus's own checks (promtool) -----------------------------------------------------------

needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool absent (Debian: prometheus)"
)


def promtool(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["promtool", *map(str, args)], capture_output=True, text=True, timeout=60, cwd=cwd
    )


@needs_promtool
def test_prometheus_parses_every_expression(tmp_path: Path) -> None:
    checked = promtool("check", "rules", ALERTS)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    grafana = {"$__rate_interval": "5m", "$instance": ".*", "$job": ".*"}
    records = []
    for index, panel in enumerate(dashboard_panels()):
        for target in panel["targets"]:
            expr = target["expr"]
            for variable, value in grafana.items():
                expr = expr.replace(variable, value)
            assert "$" not in expr, f"an unknown Grafana variable in {target['expr']}"
            records.append({"record": f"panel_{index}_{target['refId']}", "expr": expr})
    rules = tmp_path / "dashboard.yml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": records}]}))
    checked = promtool("check", "rules", rules)
    assert checked.returncode == 0, checked.stdout + checked.stderr


# Each case: the series (promtool's expanding notation, one sample a minute), when to evaluate, and
# the alert's expected value as its annotations print it (None: it must not fire).
SERIES = 'job="ocrwatch", instance="host:9464"'
CASES: dict[str, list[tuple[list[tuple[str, str]], str, str | None]]] = {
    "OcrwatchDown": [
        ([(f"up{{{SERIES}}}", "1x5 0x10")], "15m", "0"),
        ([(f"up{{{SERIES}}}", "1x15")], "15m", None),
    ],
    "OcrwatchNotReady": [
        ([(f"ocrwatch_ready{{{SERIES}}}", "0x30")], "25m", "0"),
        ([(f"ocrwatch_ready{{{SERIES}}}", "0x2 1x28")], "25m", None),  # a cold start, then ready
    ],
    "OcrwatchEngineRestartLoop": [
        ([(f"ocrwatch_engine_restarts_total{{{SERIES}}}", "0 1 2 3 3")], "5m", "4"),
        ([(f"ocrwatch_engine_restarts_total{{{SERIES}}}", "0 1 1 1 1")], "5m", None),
    ],
    "OcrwatchQueueStalled": [
        (
            [
                (f'ocrwatch_active_documents{{{SERIES}, state="running"}}', "4x60"),
                (f'ocrwatch_pages_total{{{SERIES}, status="ok"}}', "0+10x20 200x40"),
                (f'ocrwatch_documents_total{{{SERIES}, status="ok"}}', "0+1x20 20x40"),
            ],
            "50m",
            "4",
        ),
        (
            [
                (
                    f'ocrwatch_active_documents{{{SERIES}, state="running"}}',
                    "4x60",
                ),  # one long document, pages moving
                (f'ocrwatch_pages_total{{{SERIES}, status="ok"}}', "0+10x60"),
                (f'ocrwatch_documents_total{{{SERIES}, status="ok"}}', "0x60"),
            ],
            "50m",
            None,
        ),
        (
            [
                (
                    f'ocrwatch_active_documents{{{SERIES}, state="running"}}',
                    "0x60",
                ),  # idle: nothing to do
                (f'ocrwatch_pages_total{{{SERIES}, status="ok"}}', "0x60"),
                (f'ocrwatch_documents_total{{{SERIES}, status="ok"}}', "0x60"),
            ],
            "50m",
            None,
        ),
    ],
    "OcrwatchOldestJobWaiting": [
        ([(f"ocrwatch_oldest_waiting_seconds{{{SERIES}}}", "6000+60x60")], "55m", "2h 35m 0s"),
        (
            [(f"ocrwatch_oldest_waiting_seconds{{{SERIES}}}", "8000x60")],
            "50m",
            None,
        ),  # old but finishing in turn
    ],
    "OcrwatchFailureRate": [
        (
            [
                (f'ocrwatch_documents_total{{{SERIES}, status="failed"}}', "0+1x40"),
                (f'ocrwatch_documents_total{{{SERIES}, status="ok"}}', "0+1x40"),
            ],
            "35m",
            "50%",
        ),
        (
            [
                (
                    f'ocrwatch_documents_total{{{SERIES}, status="failed"}}',
                    "0+0.1x40",
                ),  # 3 in 30 min: too few
                (f'ocrwatch_documents_total{{{SERIES}, status="ok"}}', "0+0.1x40"),
            ],
            "35m",
            None,
        ),
        (
            [
                (f'ocrwatch_documents_total{{{SERIES}, status="failed"}}', "0+1x40"),
                (f'ocrwatch_documents_total{{{SERIES}, status="ok"}}', "0+9x40"),
            ],
            "35m",
            None,
        ),  # 10 %
    ],
}


def _expected(rule: dict[str, Any], value: str) -> dict[str, Any]:
    """The alert as promtool reports it: the rule's labels and its annotations rendered for
    ``value``."""

    def render(template: str) -> str:
        template = template.replace("{{ $labels.instance }}", "host:9464")
        return re.sub(r"\{\{ \$value(?: \|[^}]*)? \}\}", value, template)

    return {
        "exp_labels": {"job": "ocrwatch", "instance": "host:9464", **rule["labels"]},
        "exp_annotations": {key: render(text) for key, text in rule["annotations"].items()},
    }


@needs_promtool
def test_each_alert_fires_on_its_failure_and_not_on_a_healthy_daemon(tmp_path: Path) -> None:
    rules = {rule["alert"]: rule for rule in alert_rules()}
    assert CASES.keys() == rules.keys(), "every alert needs its cases here"
    tests = []
    for alert, cases in CASES.items():
        for series, at, value in cases:
            tests.append(
                {
                    "interval": "1m",
                    "input_series": [{"series": name, "values": values} for name, values in series],
                    "alert_rule_test": [
                        {
                            "eval_time": at,
                            "alertname": alert,
                            "exp_alerts": [] if value is None else [_expected(rules[alert], value)],
                        }
                    ],
                }
            )
    shutil.copy(ALERTS, tmp_path / "alerts.yml")
    (tmp_path / "tests.yml").write_text(
        yaml.safe_dump({"rule_files": ["alerts.yml"], "tests": tests})
    )
    result = promtool("test", "rules", "tests.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
