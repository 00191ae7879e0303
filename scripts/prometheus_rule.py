"""Writes platform/k8s/production/prometheusrule.yaml from platform/prometheus/rules.yml: the
same alert rules as a Prometheus Operator PrometheusRule. Run it after changing rules.yml;
tests/test_platform_overlays.py fails while the two differ.

    .venv/bin/python scripts/prometheus_rule.py
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "platform" / "prometheus" / "rules.yml"
TARGET = REPO / "platform" / "k8s" / "production" / "prometheusrule.yaml"
HEADER = """\
# Prometheus Operator: the alert rules of platform/prometheus/rules.yml (their comments and
# promtool unit tests are there), as a PrometheusRule. Generated from that file; do not edit
# here: after changing rules.yml, run `.venv/bin/python scripts/prometheus_rule.py`
# (tests/test_platform_overlays.py fails while the two differ). Label it for your Prometheus
# as servicemonitor.yaml says (kube-prometheus-stack: `release: <its release name>`).
"""


def prometheus_rule(rules_text: str) -> dict[str, Any]:
    groups = yaml.safe_load(rules_text)["groups"]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "gpushare", "labels": {"app.kubernetes.io/name": "gpushare"}},
        "spec": {"groups": groups},
    }


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the rules' expressions) as literal blocks, as rules.yml has them."""


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str)


def render(rules_text: str) -> str:
    body = yaml.dump(prometheus_rule(rules_text), Dumper=_Dumper, sort_keys=False, width=100)
    return HEADER + body


if __name__ == "__main__":
    TARGET.write_text(render(RULES.read_text()))
    print(f"wrote {TARGET.relative_to(REPO)}")
