"""The Grafana dashboards of platform/grafana/: each parses, is what
scripts/grafana_dashboards.py renders, has a query in every panel, asks only for series (and
labels, and histogram buckets) the web exports, shows what the issue asks of it, and each
query parses in promtool. Their provisioning for compose and their ConfigMaps for Kubernetes
point at them."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from telemetry.exporter import METRICS
from telemetry.ledger import LATENCY_BUCKETS_S, TTFT_BUCKETS_S, WAIT_BUCKETS_S
from tests.test_metrics_rules import PROMTOOL, exposed_sample_names

REPO = Path(__file__).resolve().parent.parent
GRAFANA = REPO / "platform" / "grafana"
DASHBOARDS = GRAFANA / "dashboards"
METRICS_DOC = REPO / "docs" / "METRICS.md"
SCRIPT = REPO / "scripts" / "grafana_dashboards.py"
NAMES = {"gpushare-fleet.json", "gpushare-tenants.json", "gpushare-latency.json"}
BUCKETS = {
    "gpushare_admission_wait_seconds": WAIT_BUCKETS_S,
    "gpushare_time_to_first_token_seconds": TTFT_BUCKETS_S,
    "gpushare_request_latency_seconds": LATENCY_BUCKETS_S,
}
# Grafana's own variables, as a query may use them, and a value each for promtool.
GRAFANA_VARIABLES = {"__rate_interval": "2m", "__range": "6h", "__interval": "30s"}
SERIES = re.compile(r"\b(?:gpushare_\w+|vllm:\w+)")


def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("grafana_dashboards", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@cache
def dashboards() -> dict[str, dict[str, Any]]:
    return {path.name: json.loads(path.read_text()) for path in sorted(DASHBOARDS.glob("*.json"))}


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel but rows, those inside collapsed rows included."""
    for panel in board["panels"]:
        if panel["type"] == "row":
            yield from panel.get("panels", [])
        else:
            yield panel


def queries(board: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) of every panel's target and every query variable."""
    for panel in panels(board):
        for query in panel["targets"]:
            yield panel["title"], query["expr"]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            found = re.fullmatch(r"label_values\((.+), *(\w+)\)", variable["query"]["query"])
            assert found, variable
            yield f"${variable['name']}", found[1]


def concrete(board: dict[str, Any], expr: str) -> str:
    """The expression as Grafana sends it with every variable at "All" (`.*`): no `$` left
    means it names only the dashboard's variables and Grafana's."""
    values = {v["name"]: ".*" for v in board["templating"]["list"] if v["type"] == "query"}
    values |= GRAFANA_VARIABLES

    def one(match: re.Match[str]) -> str:
        name = match[1] or match[2]
        assert name in values, f"${name} is no variable of {board['uid']}"
        return values[name]

    result = re.sub(r"\$\{(\w+)\}|\$(\w+)", one, expr)
    assert "$" not in result, result
    return result


@cache
def documented_labels() -> dict[str, set[str]]:
    """Each exported sample name's labels, from docs/METRICS.md's table of series."""
    labels: dict[str, set[str]] = {}
    for line in METRICS_DOC.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`gpushare_"):
            continue
        names = re.findall(r"`(gpushare_\w+)`", cells[0].split(" (")[0])
        for name in names:
            listed = re.sub(r"\([^)]*\)", "", cells[2])  # "kind (prompt, completion)"
            labels[name] = {label.strip() for label in listed.split(",") if label.strip()}
    return labels


def labels_of(sample: str) -> set[str]:
    """The labels of a sample name (a histogram's `_bucket` adds `le`)."""
    for base in (sample, sample.removesuffix("_bucket"), re.sub(r"_(sum|count)$", "", sample)):
        if base in documented_labels():
            return documented_labels()[base] | ({"le"} if sample.endswith("_bucket") else set())
    raise AssertionError(f"{sample} is not in docs/METRICS.md's table")


def test_the_three_dashboards_are_there_and_what_the_script_renders():
    assert set(dashboards()) == NAMES
    rendered = script().dashboards()
    assert set(rendered) == NAMES
    for name, board in rendered.items():
        assert (DASHBOARDS / name).read_text() == script().render(board), (
            f"{name}: run .venv/bin/python scripts/grafana_dashboards.py"
        )


def test_every_dashboard_has_a_uid_a_title_and_a_prometheus_datasource_variable():
    uids = set()
    for name, board in dashboards().items():
        assert board["uid"] == name.removesuffix(".json")
        assert len(board["uid"]) <= 40  # Grafana's limit
        assert board["title"].startswith("gpushare / ")
        assert board["schemaVersion"] >= 39
        uids.add(board["uid"])
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"
        for variable in variables.values():
            if variable["type"] == "query":
                assert variable["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
                # "All" is `.*`, so the panels' `=~"$name"` matches every value.
                assert variable["allValue"] == ".*"
    assert len(uids) == len(dashboards())


def test_every_panel_has_a_query_on_the_datasource_variable_and_its_own_place():
    for board in dashboards().values():
        ids = [p["id"] for p in board["panels"]] + [
            p["id"] for row in board["panels"] for p in row.get("panels", [])
        ]
        assert len(ids) == len(set(ids)), board["uid"]
        assert any(p["type"] == "row" for p in board["panels"])
        for panel in panels(board):
            assert panel["type"] in {"timeseries", "stat", "bargauge"}, panel["title"]
            assert panel["title"]
            assert panel["description"], panel["title"]
            assert panel["targets"], panel["title"]
            assert panel["datasource"]["uid"] == "${datasource}"
            refs = [t["refId"] for t in panel["targets"]]
            assert len(refs) == len(set(refs)), panel["title"]
            for query in panel["targets"]:
                assert query["expr"].strip(), panel["title"]
                assert query["datasource"]["uid"] == "${datasource}"
            grid = panel["gridPos"]
            assert grid["x"] + grid["w"] <= 24, panel["title"]


def test_every_query_names_only_series_the_web_exports():
    exposed = exposed_sample_names()
    for board in dashboards().values():
        for where, expr in queries(board):
            used = set(SERIES.findall(expr))
            assert used, (board["uid"], where)
            # The engines' own vLLM series are not read: the platform's pages carry what
            # the dashboards need, and those are scraped once.
            assert used <= exposed, (board["uid"], where, used - exposed)


def test_every_query_uses_only_the_dashboards_variables_and_grafanas():
    for board in dashboards().values():
        for _, expr in queries(board):
            concrete(board, expr)


def test_the_series_table_of_the_docs_lists_every_exported_series():
    assert set(documented_labels()) >= {
        name + ("_total" if kind == "counter" else "") for name, (kind, _) in METRICS.items()
    }


def test_every_query_asks_only_for_labels_its_series_carry():
    for board in dashboards().values():
        for where, expr in queries(board):
            available = set().union(*(labels_of(s) for s in SERIES.findall(expr)))
            # In selectors: the labels of that very series.
            for sample, matchers in re.findall(r"\b(gpushare_\w+)\{([^}]*)\}", expr):
                names = set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", matchers))
                assert names <= labels_of(sample), (board["uid"], where, sample, names)
            # In by (...) and on (...): the labels of the series the expression reads.
            for grouping in re.findall(r"\b(?:by|on)\s*\(([^)]*)\)", expr):
                names = {n.strip() for n in grouping.split(",") if n.strip()}
                assert names <= available, (board["uid"], where, names - available)


def test_every_legend_names_labels_its_query_keeps():
    for board in dashboards().values():
        for panel in panels(board):
            for query in panel["targets"]:
                available = set().union(*(labels_of(s) for s in SERIES.findall(query["expr"])))
                legend = set(re.findall(r"\{\{(\w+)\}\}", query["legendFormat"]))
                assert legend <= available, (panel["title"], legend - available)
                kept = re.findall(r"\b(?:sum|max|min|count) by \(([^)]*)\)", query["expr"])
                for grouping in kept[:1]:  # the outermost aggregation keeps only its labels
                    assert legend <= {n.strip() for n in grouping.split(",")}, panel["title"]


def test_bucket_selectors_name_a_bucket_the_histogram_has():
    """`le` as the exporter writes it (repr of the bound, e.g. "2.0", as Prometheus 3 also
    normalises it): a bucket that is not there would select nothing."""
    for board in dashboards().values():
        for where, expr in queries(board):
            for histogram, le in re.findall(r"\b(gpushare_\w+)_bucket\{[^}]*le=\"([^\"]+)\"", expr):
                assert le in {repr(b) for b in BUCKETS[histogram]}, (where, histogram, le)


def expressions(name: str) -> set[str]:
    return {expr for _, expr in queries(dashboards()[name])}


def uses(name: str, *fragments: str) -> bool:
    """Whether one query of the dashboard holds every fragment."""
    return any(all(f in expr for f in fragments) for expr in expressions(name))


def test_fleet_shows_engines_seats_kv_gpus_the_offline_gate_queue_and_engine_faults():
    fleet = "gpushare-fleet.json"
    for fragments in (
        ("gpushare_engine_up",),
        ("gpushare_engine_seat_occupancy_ratio",),
        ("gpushare_engine_class_seats",),
        ("gpushare_engine_class_held_back",),
        ("gpushare_engine_kv_cache_usage_ratio",),
        ("gpushare_engine_kv_budget_bytes",),
        ("gpushare_engine_reserved_bytes",),
        ("gpushare_gpu_sm_activity_ratio",),
        ("gpushare_gpu_tensor_activity_ratio",),
        ("gpushare_gpu_utilization_ratio",),
        ("gpushare_gpu_memory_used_bytes",),
        ("gpushare_gpu_power_watts",),
        ("gpushare_engine_load",),
        ("gpushare_engine_offline_inflight",),
        ("gpushare_queue_depth", "class"),
        ("gpushare_queue_running", "class"),
        ("gpushare_queue_oldest_wait_seconds", "class"),
        ("rate(gpushare_engine_preemptions_total",),
        ("increase(gpushare_engine_oom_total",),
    ):
        assert uses(fleet, *fragments), fragments


def test_tenants_shows_shares_against_weights_quota_spend_refusals_and_classes():
    tenants = "gpushare-tenants.json"
    variables = {v["name"] for v in dashboards()[tenants]["templating"]["list"]}
    assert "tenant" in variables
    for fragments in (
        ("gpushare_tokens_total", "scalar("),  # a share of all tenants' tokens
        ("gpushare_tenant_weight", "scalar("),  # a share of the weights
        ("gpushare_tenant_reserved_bytes",),
        ("gpushare_tenant_quota_bytes",),
        ("gpushare_tenant_burst_bytes",),
        ("gpushare_tokens_total", "kind"),
        ("gpushare_rejections_total", "reason"),
        ("gpushare_requests_total", "by (class)"),
    ):
        assert uses(tenants, *fragments), fragments
    assert all('tenant=~"$tenant"' in e for e in expressions(tenants) if "by (tenant" in e)


def test_latency_shows_each_class_against_its_targets_waits_and_engine_bounds():
    board = dashboards()["gpushare-latency.json"]
    for fragments in (
        ("histogram_quantile(0.99", "gpushare_time_to_first_token_seconds_bucket", "class"),
        ("histogram_quantile(0.5", "gpushare_time_to_first_token_seconds_bucket", "class"),
        ("histogram_quantile(0.99", "gpushare_request_latency_seconds_bucket", "class"),
        ("histogram_quantile(0.5", "gpushare_request_latency_seconds_bucket", "class"),
        ("gpushare_admission_wait_seconds_bucket", "by (le, class)"),
        ("gpushare_engine_ttft_p99_seconds",),
        ("gpushare_engine_ttft_target_seconds",),
        ("gpushare_engine_seats_below",),
        ("gpushare_engine_seats_below_held",),
    ):
        assert uses("gpushare-latency.json", *fragments), fragments
    # The targets of the alert rules, drawn as thresholds on the panels of their class.
    rules = (REPO / "platform" / "prometheus" / "rules.yml").read_text()
    for title, goal in (
        ("Interactive request latency", 2),
        ("Standard request latency", 10),
        ("Interactive time to first token", 1),
    ):
        (panel,) = [p for p in panels(board) if p["title"] == title]
        steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
        assert [s["value"] for s in steps if s["value"] is not None] == [goal], title
        assert panel["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"] != "off"
        assert f") > {goal}\n" in rules, (title, goal)


def promtool_rules(board: dict[str, Any]) -> dict[str, Any]:
    rules = [
        {"record": f"dashboard:query:{index}", "expr": concrete(board, expr)}
        for index, (_, expr) in enumerate(queries(board))
    ]
    return {"groups": [{"name": board["uid"], "rules": rules}]}


def promtool(*args: str, cwd: Path) -> None:
    if not Path(PROMTOOL).exists():
        pytest.fail(
            f"No promtool at {PROMTOOL}: run scripts/ensure_promtool.sh "
            "(or point GPUSHARE_PROMTOOL at one)."
        )
    result = subprocess.run(
        [PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_query_parses_in_promtool(tmp_path: Path):
    """Each query, its variables at "All" and Grafana's intervals filled in, as a recording
    rule: `promtool check rules` parses it."""
    for name, board in dashboards().items():
        path = tmp_path / name.replace(".json", ".yml")
        path.write_text(yaml.safe_dump(promtool_rules(board)))
        promtool("check", "rules", path.name, cwd=tmp_path)


def test_the_compose_prometheus_config_is_valid_with_its_token_file(tmp_path: Path):
    """platform/prometheus/prometheus.yml, its token file where the test can make one."""
    folder = REPO / "platform" / "prometheus"
    config = yaml.safe_load((folder / "prometheus.yml").read_text())
    token = tmp_path / "token"
    token.write_text("scrape-me")
    for job in config["scrape_configs"]:
        job["authorization"]["credentials_file"] = str(token)
    shutil.copy(folder / "rules.yml", tmp_path / "rules.yml")
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    promtool("check", "config", "prometheus.yml", cwd=tmp_path)


def test_grafana_is_provisioned_with_the_prometheus_of_compose_and_these_files():
    compose = yaml.safe_load((REPO / "platform" / "compose.yaml").read_text())["services"]
    (source,) = yaml.safe_load(
        (GRAFANA / "provisioning" / "datasources" / "prometheus.yaml").read_text()
    )["datasources"]
    assert source["type"] == "prometheus"
    assert source["url"] == "http://prometheus:9090"
    assert "prometheus" in compose
    scrape = yaml.safe_load((REPO / "platform" / "prometheus" / "prometheus.yml").read_text())
    assert source["jsonData"]["timeInterval"] == scrape["global"]["scrape_interval"]
    (provider,) = yaml.safe_load(
        (GRAFANA / "provisioning" / "dashboards" / "gpushare.yaml").read_text()
    )["providers"]
    mounts = dict(volume.split(":")[:2] for volume in compose["grafana"]["volumes"])
    assert mounts["./grafana/dashboards"] == provider["options"]["path"]
    for folder in ("datasources", "dashboards"):
        assert mounts[f"./grafana/provisioning/{folder}"] == f"/etc/grafana/provisioning/{folder}"
    home = compose["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert Path(home).name in NAMES
    assert Path(home).parent == Path(provider["options"]["path"])


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (for `kubectl kustomize`)")
def test_production_ships_each_dashboard_as_a_configmap_for_grafanas_sidecar():
    kubectl = shutil.which("kubectl")
    assert kubectl is not None
    out = subprocess.run(
        [kubectl, "kustomize", str(REPO / "platform" / "k8s" / "production")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    maps = [
        doc
        for doc in yaml.safe_load_all(out)
        if doc
        and doc["kind"] == "ConfigMap"
        and "grafana_dashboard" in doc["metadata"].get("labels", {})
    ]
    assert {name for doc in maps for name in doc["data"]} == NAMES
    for doc in maps:
        assert doc["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert doc["metadata"]["namespace"] == "gpushare"
        ((name, text),) = doc["data"].items()
        assert json.loads(text) == dashboards()[name]
