"""The Prometheus alert rules parse, use only metric names the web exports, and pass their
unit tests (platform/prometheus/rules_test.yml) in promtool."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from telemetry.exporter import CLUSTER_METRICS, METRICS, PROCESS_METRICS

RULES = Path(__file__).resolve().parents[1] / "platform" / "prometheus" / "rules.yml"
RULES_TEST = RULES.with_name("rules_test.yml")
# Debian's `prometheus` package ships it; scripts/ensure_promtool.sh installs it.
PROMTOOL = os.environ.get("GPUSHARE_PROMTOOL", "/usr/bin/promtool")
SUFFIXES = {"gauge": ("",), "counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}


def exposed_sample_names() -> set[str]:
    """The sample names the text format shows for each documented metric."""
    return {name + suffix for name, (kind, _) in METRICS.items() for suffix in SUFFIXES[kind]}


def rules() -> list[dict[str, Any]]:
    data = yaml.safe_load(RULES.read_text())
    return [rule for group in data["groups"] for rule in group["rules"]]


def test_the_rules_file_parses_into_named_groups_of_alerts():
    data = yaml.safe_load(RULES.read_text())
    assert data["groups"]
    for group in data["groups"]:
        assert group["name"].startswith("gpushare-")
        for rule in group["rules"]:
            assert set(rule) >= {"alert", "expr", "for", "labels", "annotations"}
            assert rule["labels"]["severity"] in {"page", "warning", "info"}
            assert rule["annotations"]["summary"]


def test_the_rules_refer_only_to_metrics_that_exist():
    exposed = exposed_sample_names()
    for rule in rules():
        used = set(re.findall(r"\bgpushare_\w+", rule["expr"]))
        assert used, rule["alert"]
        assert used <= exposed, (rule["alert"], used - exposed)


def test_the_per_pod_series_are_only_counted_never_summed():
    """gpushare_build_info is one series per pod; the rules count builds, never add it up
    with the cluster-wide series."""
    cluster = set(CLUSTER_METRICS)
    for rule in rules():
        used = {n.removesuffix("_bucket") for n in re.findall(r"\bgpushare_\w+", rule["expr"])}
        if used & set(PROCESS_METRICS):
            assert not used & cluster, rule["alert"]
            assert "sum" not in rule["expr"], rule["alert"]


def test_the_rules_pass_their_unit_tests_in_promtool():
    if not Path(PROMTOOL).exists():
        pytest.fail(
            f"No promtool at {PROMTOOL}: run scripts/ensure_promtool.sh "
            "(or point GPUSHARE_PROMTOOL at one)."
        )
    for command in (["check", "rules", RULES.name], ["test", "rules", RULES_TEST.name]):
        result = subprocess.run(
            [PROMTOOL, *command],
            cwd=RULES.parent,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, result.stdout + result.stderr


def test_the_alerts_on_bytes_ttft_scraping_and_the_design_have_unit_tests():
    tested = {
        case["alertname"]
        for test in yaml.safe_load(RULES_TEST.read_text())["tests"]
        for case in test["alert_rule_test"]
    }
    assert {
        "GpushareTenantAtQuota",
        "GpushareRejectingForQuota",
        "GpushareInteractiveTtftP99OverTarget",
        "GpushareClusterMetricsScrapedTwice",
        "GpushareClusterMetricsAbsent",
        "GpushareWebVersionsMixed",
        "GpushareInteractiveP99OverTarget",
        "GpushareKvCacheHigh",
        "GpushareGpuTensorBusy",
        "GpushareEngineOutOfMemory",
    } <= tested


def test_the_seed_advice_is_covered_with_its_durations():
    by_name = {rule["alert"]: rule for rule in rules()}
    kv = by_name["GpushareKvCacheHigh"]
    assert "> 0.85" in kv["expr"]
    assert kv["for"] == "3m"
    p99 = by_name["GpushareInteractiveP99OverTarget"]
    assert "histogram_quantile(0.99" in p99["expr"]
    assert p99["for"] == "2m"
    # Per GPU: the engine series repeats its GPU's value once per engine on it.
    tensor = by_name["GpushareGpuTensorBusy"]
    assert tensor["expr"] == "gpushare_gpu_tensor_activity_ratio > 0.85"
    assert tensor["for"] == "5m"
    oom = by_name["GpushareEngineOutOfMemory"]
    assert "increase(gpushare_engine_oom_total[" in oom["expr"]
    assert (oom["for"], oom["labels"]["severity"]) == ("0m", "page")
    assert by_name["GpushareTenantAtQuota"]["for"] == "10m"
    assert "gpushare_engine_up == 0" in by_name["GpushareEngineDown"]["expr"]
    assert (
        "gpushare_queue_oldest_wait_seconds"
        in (by_name["GpushareInteractiveQueueWaitOverTarget"]["expr"])
    )
