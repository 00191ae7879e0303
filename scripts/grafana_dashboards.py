"""Writes the Grafana dashboards of platform/grafana/dashboards/ (fleet, tenants, latency) from
the panels below: one place for their layout, data source and PromQL. Run it after changing a
panel; tests/test_dashboards.py fails while a file differs from what this renders, and checks
that every query names only series the web exports (telemetry/exporter.py).

    .venv/bin/python scripts/grafana_dashboards.py

Every series but gpushare_build_info comes from /metrics/cluster, scraped once, so `sum`
counts each request, token and byte once (docs/METRICS.md). Targets drawn as thresholds are
those of platform/prometheus/rules.yml; change both together.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DASHBOARDS = REPO / "platform" / "grafana" / "dashboards"

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"
# The alert rules' targets (platform/prometheus/rules.yml), by class.
LATENCY_P99_TARGET_S = {"interactive": 2.0, "standard": 10.0}
TTFT_P99_TARGET_S = {"interactive": 1.0}
ADMISSION_P95_TARGET_S = 30.0
INTERACTIVE_OLDEST_WAIT_TARGET_S = 5.0
KV_CACHE_HIGH = 0.85
# An engine's default offline_load_threshold (fairqueue/domain.py; per pool in the console).
OFFLINE_LOAD_THRESHOLD = 0.4
CLASSES = ("interactive", "standard", "offline")

Panel = dict[str, Any]


def target(expr: str, legend: str = "", *, instant: bool = False) -> dict[str, Any]:
    return {
        "datasource": DATASOURCE,
        "expr": expr,
        "legendFormat": legend or "__auto",
        "range": not instant,
        "instant": instant,
    }


def thresholds(*steps: tuple[str, float]) -> dict[str, Any]:
    """Green below the first step's value; each step's colour from its value on."""
    return {
        "mode": "absolute",
        "steps": [{"color": "green", "value": None}]
        + [{"color": color, "value": value} for color, value in steps],
    }


def dashed(pattern: str) -> dict[str, Any]:
    """Series whose legend matches `pattern` (targets, weight shares) as dashed lines."""
    return {
        "matcher": {"id": "byRegexp", "options": pattern},
        "properties": [
            {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
            {"id": "custom.fillOpacity", "value": 0},
        ],
    }


def timeseries(
    title: str,
    description: str,
    targets: list[dict[str, Any]],
    *,
    unit: str = "short",
    limit: tuple[str, float] | None = None,
    maximum: float | None = None,
    overrides: list[dict[str, Any]] | None = None,
    stack: bool = False,
) -> Panel:
    """A graph; `limit` (colour, value) is drawn as a dashed threshold line."""
    defaults: dict[str, Any] = {
        "unit": unit,
        "min": 0,
        "color": {"mode": "palette-classic"},
        "custom": {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"mode": "normal" if stack else "none", "group": "A"},
            "thresholdsStyle": {"mode": "dashed" if limit else "off"},
        },
        "thresholds": thresholds(limit) if limit else thresholds(),
    }
    if maximum is not None:
        defaults["max"] = maximum
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
        "options": {
            "legend": {
                "showLegend": True,
                "displayMode": "table",
                "placement": "bottom",
                "calcs": ["lastNotNull", "max"],
            },
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "targets": targets,
    }


def stat(
    title: str,
    description: str,
    targets: list[dict[str, Any]],
    *,
    unit: str = "short",
    steps: tuple[tuple[str, float], ...] = (),
) -> Panel:
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "thresholds": thresholds(*steps),
                "color": {"mode": "thresholds"},
            },
            "overrides": [],
        },
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "area",
            "textMode": "value_and_name",
            "orientation": "auto",
            "justifyMode": "auto",
        },
        "targets": targets,
    }


def bargauge(
    title: str,
    description: str,
    targets: list[dict[str, Any]],
    *,
    unit: str = "short",
    steps: tuple[tuple[str, float], ...] = (),
    maximum: float | None = None,
) -> Panel:
    """Bars of each series' latest value (instant queries)."""
    defaults: dict[str, Any] = {
        "unit": unit,
        "min": 0,
        "thresholds": thresholds(*steps),
        "color": {"mode": "thresholds" if steps else "palette-classic"},
    }
    if maximum is not None:
        defaults["max"] = maximum
    return {
        "type": "bargauge",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "orientation": "horizontal",
            "displayMode": "gradient",
            "showUnfilled": True,
            "valueMode": "color",
            "namePlacement": "auto",
            "minVizHeight": 10,
            "minVizWidth": 0,
            "maxVizHeight": 300,
            "sizing": "auto",
        },
        "targets": targets,
    }


def row(
    title: str, panels: list[Panel], *, collapsed: bool = False
) -> tuple[str, bool, list[Panel]]:
    return title, collapsed, panels


def datasource_variable() -> dict[str, Any]:
    return {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "includeAll": False,
        "multi": False,
        "options": [],
        "refresh": 1,
        "regex": "",
    }


def query_variable(name: str, label: str, query: str) -> dict[str, Any]:
    """A multi-value variable of a label's values; "All" matches every value (`=~".*"`), so
    the panels filter with `label=~"$name"`."""
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "definition": query,
        "query": {"query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "hide": 0,
        "includeAll": True,
        "allValue": ".*",
        "multi": True,
        "options": [],
        "refresh": 2,
        "regex": "",
        "sort": 1,
    }


def dashboard(
    uid: str,
    title: str,
    description: str,
    variables: list[dict[str, Any]],
    rows: list[tuple[str, bool, list[Panel]]],
) -> dict[str, Any]:
    """Lays the rows out on Grafana's 24-column grid, panels 8 high, filled left to right.
    A collapsed row holds its panels in its own `panels`; an open row is followed by them."""
    panels: list[Panel] = []
    next_id = 1
    y = 0
    for title_, collapsed, members in rows:
        row_panel: Panel = {
            "type": "row",
            "title": title_,
            "collapsed": collapsed,
            "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
            "id": next_id,
            "panels": [],
        }
        next_id += 1
        y += 1
        panels.append(row_panel)
        x = 0
        for panel in members:
            width = panel.pop("width", 12)
            if x + width > 24:
                x, y = 0, y + 8
            panel["gridPos"] = {"h": 8, "w": width, "x": x, "y": y}
            panel["id"] = next_id
            next_id += 1
            for ref, query in enumerate(panel["targets"]):
                query["refId"] = chr(ord("A") + ref)
            (row_panel["panels"] if collapsed else panels).append(panel)
            x += width
        y += 8
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["gpushare"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "timepicker": {},
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "weekStart": "",
        "links": [
            {
                "title": "gpushare",
                "type": "dashboards",
                "tags": ["gpushare"],
                "asDropdown": True,
                "includeVars": False,
                "keepTime": True,
            }
        ],
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "templating": {"list": [datasource_variable(), *variables]},
        "panels": panels,
    }


def sized(panel: Panel, width: int) -> Panel:
    panel["width"] = width
    return panel


# --- fleet -------------------------------------------------------------------------------

E = 'engine=~"$engine"'


def fleet() -> dict[str, Any]:
    engines = row("Engines", [
        sized(stat("Engines serving", "Engines ready or draining, of those that should run "
                   "(starting, warming, ready, draining or failed).", [
            target('sum(gpushare_engine_up{model=~"$model"})', "serving"),
            target('count(gpushare_engine_up{model=~"$model"})', "should run"),
        ], steps=()), 6),
        sized(stat("Engines down", "Engines that should run but cannot serve; the alert "
                   "GpushareEngineDown fires after 5 minutes.", [
            target('count(gpushare_engine_up{model=~"$model"} == 0) or vector(0)', "down"),
        ], steps=(("red", 1),)), 6),
        timeseries("Engine up", "1 while the engine serves, 0 while it should but cannot.", [
            target(f'gpushare_engine_up{{model=~"$model", {E}}}', "{{engine}} ({{model}})"),
        ], maximum=1),
    ])  # fmt: skip
    seats = row("Seats", [
        timeseries("Seat occupancy", "Sequences each engine says it runs over its seats "
                   "(max_num_seqs).", [
            target(f"gpushare_engine_seat_occupancy_ratio{{{E}}}", "{{engine}}"),
        ], unit="percentunit", maximum=1),
        timeseries("In flight: the fair queue's vs the engine's", "What the fair queue has "
                   "sent each engine, what the engine says it runs, and what waits inside it "
                   "(its queue of refills).", [
            target(f"gpushare_engine_inflight{{{E}}}", "{{engine}} in flight"),
            target(f"gpushare_engine_requests_running{{{E}}}", "{{engine}} running"),
            target(f"gpushare_engine_requests_waiting{{{E}}}", "{{engine}} waiting"),
        ]),
        timeseries("Class seats", "The seats each class may hold on each engine now: its "
                   "seats and queue, less what the bounds of the classes above keep from it.", [
            target(f"gpushare_engine_class_seats{{{E}}}", "{{engine}} {{class}}"),
        ]),
        timeseries("Classes held back", "On how many engines a full seat bound of a class "
                   "above holds each class back (a TTFT target or fixed bound at work).", [
            target(f"sum by (class) (gpushare_engine_class_held_back{{{E}}})", "{{class}}"),
        ]),
    ])  # fmt: skip
    kv = row("KV cache", [
        timeseries("KV cache usage", f"The engines' own KV-cache usage; the alert "
                   f"GpushareKvCacheHigh fires over {KV_CACHE_HIGH:.0%} for 3 minutes.", [
            target(f'gpushare_engine_kv_cache_usage_ratio{{model=~"$model", {E}}}',
                   "{{engine}}"),
        ], unit="percentunit", maximum=1, limit=("red", KV_CACHE_HIGH)),
        timeseries("KV reserved of the budget", "What the fair queue has reserved on each "
                   "engine against the KV its jobs may reserve, and (predict mode) the KV the "
                   "engine measured beyond its reservations.", [
            target(f"gpushare_engine_kv_budget_bytes{{{E}}}", "{{engine}} budget"),
            target(f"gpushare_engine_reserved_bytes{{{E}}}", "{{engine}} reserved"),
            target(f"gpushare_engine_kv_beyond_reserved_bytes{{{E}}}",
                   "{{engine}} beyond reserved"),
        ], unit="bytes", overrides=[dashed(".* budget")]),
        timeseries("KV admission scale", "The share of the KV budget picks may fill: below 1 "
                   "after the engine preempted (predict mode), 1 otherwise.", [
            target(f"gpushare_engine_kv_admission_scale{{{E}}}", "{{engine}}"),
        ], unit="percentunit", maximum=1),
        timeseries("Preemptions", "Requests the engines preempted for KV room, per minute: "
                   "none is expected while reservations hold.", [
            target(f'sum by (engine) (rate(gpushare_engine_preemptions_total{{model=~"$model",'
                   f' {E}}}[{RATE}])) * 60', "{{engine}}"),
        ]),
        timeseries("Out-of-memory deaths", "Engines that died out of memory (torch or CUDA, "
                   "no room for the KV cache at start, or the kernel's OOM killer), in the "
                   "last hour; GpushareEngineOutOfMemory pages at the first.", [
            target(f'sum by (engine) (increase(gpushare_engine_oom_total{{model=~"$model",'
                   f' {E}}}[1h]))', "{{engine}}"),
        ]),
    ])  # fmt: skip
    gate = row("Offline gate", [
        timeseries("Engine load (the offline gate reads it)", "max(KV usage, reserved / "
                   "capacity, GPU tensor activity). Offline work is held back while it is at "
                   "the pool's offline_load_threshold (default "
                   f"{OFFLINE_LOAD_THRESHOLD}, dashed), and let in again below it less the "
                   "margin.", [
            target(f'gpushare_engine_load{{model=~"$model", {E}}}', "{{engine}}"),
        ], unit="percentunit", maximum=1, limit=("orange", OFFLINE_LOAD_THRESHOLD)),
        timeseries("Offline in flight", "Of each engine's seats in flight, those offline jobs "
                   "hold: they should fall when online work arrives.", [
            target(f"gpushare_engine_offline_inflight{{{E}}}", "{{engine}} offline"),
            target(f"gpushare_engine_inflight{{{E}}}", "{{engine}} all"),
        ], overrides=[dashed(".* all")]),
    ])  # fmt: skip
    gpus = row("GPUs", [
        timeseries("SM and tensor activity", "NVML GPM (Hopper and later): the share of SMs "
                   "busy and of time they ran tensor instructions.", [
            target('gpushare_gpu_sm_activity_ratio{node=~"$node"}', "{{node}}/{{gpu}} SM"),
            target('gpushare_gpu_tensor_activity_ratio{node=~"$node"}',
                   "{{node}}/{{gpu}} tensor"),
        ], unit="percentunit", maximum=1),
        timeseries("Utilization", "NVML utilization.gpu: the share of time any kernel ran "
                   "(busy with a single sequence: not how much of the GPU is used).", [
            target('gpushare_gpu_utilization_ratio{node=~"$node"}', "{{node}}/{{gpu}}"),
        ], unit="percentunit", maximum=1),
        timeseries("Memory", "GPU memory in use of all.", [
            target('gpushare_gpu_memory_used_bytes{node=~"$node"}', "{{node}}/{{gpu}} used"),
            target('gpushare_gpu_memory_total_bytes{node=~"$node"}',
                   "{{node}}/{{gpu}} total"),
        ], unit="bytes", overrides=[dashed(".* total")]),
        timeseries("Power and temperature", "Power draw (W) and temperature (C).", [
            target('gpushare_gpu_power_watts{node=~"$node"}', "{{node}}/{{gpu}} W"),
            target('gpushare_gpu_temperature_celsius{node=~"$node"}', "{{node}}/{{gpu}} C"),
        ]),
        timeseries("Activity by engine", "The same GPM activity as the engines' samplers "
                   "report it, by engine.", [
            target(f"gpushare_engine_sm_activity_ratio{{{E}}}", "{{engine}} SM"),
            target(f"gpushare_engine_tensor_activity_ratio{{{E}}}", "{{engine}} tensor"),
        ], unit="percentunit", maximum=1),
    ])  # fmt: skip
    queue = row("Queue", [
        timeseries("Waiting by class", "Requests waiting in the fair queue.", [
            target("sum by (pool, class) (gpushare_queue_depth)", "{{pool}} {{class}}"),
        ]),
        timeseries("Running by class", "Requests picked and running on an engine.", [
            target("sum by (pool, class) (gpushare_queue_running)", "{{pool}} {{class}}"),
        ]),
        timeseries("Oldest wait by class", "How long the oldest waiting request of each class "
                   "has waited; interactive over "
                   f"{INTERACTIVE_OLDEST_WAIT_TARGET_S:g} s pages "
                   "(GpushareInteractiveQueueWaitOverTarget).", [
            target("max by (pool, class) (gpushare_queue_oldest_wait_seconds)",
                   "{{pool}} {{class}}"),
        ], unit="s", limit=("red", INTERACTIVE_OLDEST_WAIT_TARGET_S)),
    ])  # fmt: skip
    return dashboard(
        "gpushare-fleet",
        "gpushare / Fleet",
        "Engines, seats, KV cache, GPUs, the offline gate and the fair queue.",
        [
            query_variable("model", "Model", "label_values(gpushare_engine_up, model)"),
            query_variable(
                "engine", "Engine", 'label_values(gpushare_engine_up{model=~"$model"}, engine)'
            ),
            query_variable(
                "node", "GPU node", "label_values(gpushare_gpu_memory_total_bytes, node)"
            ),
        ],
        [engines, seats, kv, gate, queue, gpus],
    )


# --- tenants -----------------------------------------------------------------------------

T = 'tenant=~"$tenant"'
C = 'class=~"$class"'


def work(selector: str, by: str) -> str:
    """What the fair queue charges for, per second: prompt + 2 x completion tokens
    (fairqueue/queue.py, VTC). `or` keeps both kinds: their `kind` labels differ."""
    return (
        f'sum{by} (rate(gpushare_tokens_total{{kind="prompt", {selector}}}[{RATE}])'
        f' or 2 * rate(gpushare_tokens_total{{kind="completion", {selector}}}[{RATE}]))'
    )


def served_share() -> str:
    """Each tenant's work over all tenants' work (in the selected classes)."""
    return f"{work(f'{T}, {C}', ' by (tenant)')} / scalar({work(C, '')})"


def weight_share() -> str:
    """Each tenant's weight over the weights of the tenants served in the window."""
    served = f"(sum by (tenant) (rate(gpushare_tokens_total{{{C}}}[{RATE}])) > 0)"
    return (
        f"(gpushare_tenant_weight{{{T}}} and on (tenant) {served})"
        f" / scalar(sum(gpushare_tenant_weight and on (tenant) {served}))"
    )


def tenants() -> dict[str, Any]:
    share = row("Fair share", [
        timeseries("Served share vs weight share", "Each tenant's share of the work served "
                   "(prompt + 2 x completion tokens, what the fair queue charges) in the "
                   "selected classes, and, dashed, its weight over the weights of the tenants "
                   "served. While a tenant has requests waiting, its share should not stay "
                   "below its weight share.", [
            target(served_share(), "{{tenant}} served"),
            target(weight_share(), "{{tenant}} weight share"),
        ], unit="percentunit", maximum=1, overrides=[dashed(".* weight share")]),
        timeseries("Waiting by tenant", "Requests of each tenant waiting in the fair queue "
                   "(selected classes): a tenant below its weight share with nothing waiting "
                   "just asks for less.", [
            target(f"sum by (tenant) (gpushare_queue_depth{{{T}, {C}}})", "{{tenant}}"),
        ]),
    ])  # fmt: skip
    quota = row("Quota", [
        timeseries("KV memory held vs quota", "KV memory each tenant holds now against its "
                   "quota and its quota plus burst (dashed).", [
            target(f"gpushare_tenant_reserved_bytes{{{T}}}", "{{tenant}} held"),
            target(f"gpushare_tenant_quota_bytes{{{T}}}", "{{tenant}} quota"),
            target(f"gpushare_tenant_quota_bytes{{{T}}} + on (tenant) "
                   f"gpushare_tenant_burst_bytes{{{T}}}", "{{tenant}} quota + burst"),
        ], unit="bytes", overrides=[dashed(".* quota.*")]),
        bargauge("Quota in use now", "KV held over quota: at 100% the tenant's requests wait "
                 "for its own reservations to end, or borrow burst (over 100%).", [
            target(f"gpushare_tenant_reserved_bytes{{{T}}} / on (tenant) "
                   f"(gpushare_tenant_quota_bytes{{{T}}} > 0)", "{{tenant}}", instant=True),
        ], unit="percentunit", steps=(("orange", 0.9), ("red", 1.0))),
    ])  # fmt: skip
    spend = row("Tokens (spend)", [
        timeseries("Tokens per second", "Prompt and completion tokens served, from the usage "
                   "ledger.", [
            target(f"sum by (tenant, kind) (rate(gpushare_tokens_total{{{T}, {C}}}[{RATE}]))",
                   "{{tenant}} {{kind}}"),
        ], stack=True),
        bargauge("Tokens over the time range", "What each tenant spent in the dashboard's "
                 "time range, by model.", [
            target(f"sum by (tenant, model) (increase(gpushare_tokens_total{{{T}, {C}}}"
                   "[$__range]))", "{{tenant}} {{model}}", instant=True),
        ]),
    ])  # fmt: skip
    refusals = row("Requests and refusals", [
        timeseries("Requests by class", "Finished requests per second, by class.", [
            target(f"sum by (class) (rate(gpushare_requests_total{{{T}, {C}}}[{RATE}]))",
                   "{{class}}"),
        ], stack=True),
        timeseries("Requests by outcome", "Finished requests per second, by outcome.", [
            target(f"sum by (outcome) (rate(gpushare_requests_total{{{T}, {C}}}[{RATE}]))",
                   "{{outcome}}"),
        ], stack=True),
        timeseries("Refusals by reason", "Requests refused before queueing, per second "
                   "(quota, rate limits, budget, ...). Over one 429 a second for 10 minutes "
                   "raises GpushareRejectingForQuota.", [
            target(f"sum by (tenant, reason, status) (rate(gpushare_rejections_total{{{T}}}"
                   f"[{RATE}]))", "{{tenant}} {{reason}} ({{status}})"),
        ]),
        timeseries("Prompt tokens beyond their reservation", "Never expected: a hole in the "
                   "prompt bound (GpushareUnreservedPromptTokens).", [
            target(f"sum by (tenant) (increase(gpushare_unreserved_prompt_tokens_total{{{T}}}"
                   f"[{RATE}]))", "{{tenant}}"),
        ], limit=("red", 1)),
    ])  # fmt: skip
    return dashboard(
        "gpushare-tenants",
        "gpushare / Tenants",
        "Each tenant's share against its weight, quota in use, tokens, requests and refusals.",
        [
            query_variable("tenant", "Tenant", "label_values(gpushare_tenant_quota_bytes, tenant)"),
            query_variable("class", "Class", "label_values(gpushare_tokens_total, class)"),
        ],
        [share, quota, spend, refusals],
    )


# --- latency -----------------------------------------------------------------------------

L = 'model=~"$model", tenant=~"$tenant"'


def quantile(q: float, histogram: str, selector: str, by: str = "") -> str:
    return (
        f"histogram_quantile({q}, sum by (le{by}) (rate({histogram}_bucket{{{selector}}}[{RATE}])))"
    )


def latency_panel(request_class: str) -> Panel:
    goal = LATENCY_P99_TARGET_S.get(request_class)
    name = "gpushare_request_latency_seconds"
    selector = f'class="{request_class}", {L}'
    return timeseries(
        f"{request_class.capitalize()} request latency",
        "Arrival to last token, queueing included, P50 and P99 by model"
        + (
            f"; the target (dashed) is P99 under {goal:g} s (rules.yml)."
            if goal
            else "; no target."
        ),
        [
            target(quantile(0.5, name, selector, ", model"), "P50 {{model}}"),
            target(quantile(0.99, name, selector, ", model"), "P99 {{model}}"),
        ],
        unit="s",
        limit=("red", goal) if goal else None,
    )


def ttft_panel(request_class: str) -> Panel:
    goal = TTFT_P99_TARGET_S.get(request_class)
    name = "gpushare_time_to_first_token_seconds"
    selector = f'class="{request_class}", {L}'
    return timeseries(
        f"{request_class.capitalize()} time to first token",
        "Arrival to first token, queueing included, P50 and P99 by model"
        + (f"; the target (dashed) is P99 under {goal:g} s (rules.yml)." if goal else "."),
        [
            target(quantile(0.5, name, selector, ", model"), "P50 {{model}}"),
            target(quantile(0.99, name, selector, ", model"), "P99 {{model}}"),
        ],
        unit="s",
        limit=("red", goal) if goal else None,
    )


def within(request_class: str, goal: float) -> dict[str, Any]:
    """The share of the class's finished requests within the target: the bucket at the
    target (`le` as the exporter writes it, repr of the bound) over all."""
    name = "gpushare_request_latency_seconds"
    selector = f'class="{request_class}", {L}'
    return target(
        f'sum(rate({name}_bucket{{le="{goal!r}", {selector}}}[{RATE}]))'
        f" / sum(rate({name}_count{{{selector}}}[{RATE}]))",
        f"{request_class} within {goal:g} s",
    )


def latency() -> dict[str, Any]:
    goals = row("Within target", [
        sized(timeseries("Requests within their latency target", "The share of finished "
                         "requests whose latency (arrival to last token) is within the "
                         "class's P99 target: 99% or more holds the target.", [
            within(request_class, goal) for request_class, goal in LATENCY_P99_TARGET_S.items()
        ], unit="percentunit", maximum=1, limit=("red", 0.99)), 24),
    ])  # fmt: skip
    requests = row("Request latency by class", [latency_panel(c) for c in CLASSES])
    ttft = row("Time to first token by class", [ttft_panel(c) for c in CLASSES])
    wait = row("Queue wait", [
        timeseries("Admission wait by class", "Arrival to being picked, P50 and P95 by class; "
                   f"P95 over {ADMISSION_P95_TARGET_S:g} s for 5 minutes raises "
                   "GpushareAdmissionWaitP95OverTarget.", [
            target(quantile(0.5, "gpushare_admission_wait_seconds", L, ", class"),
                   "P50 {{class}}"),
            target(quantile(0.95, "gpushare_admission_wait_seconds", L, ", class"),
                   "P95 {{class}}"),
        ], unit="s", limit=("red", ADMISSION_P95_TARGET_S)),
        timeseries("Oldest wait now by class", "The oldest waiting request of each class; "
                   f"interactive over {INTERACTIVE_OLDEST_WAIT_TARGET_S:g} s pages.", [
            target('max by (class) (gpushare_queue_oldest_wait_seconds{tenant=~"$tenant"})',
                   "{{class}}"),
        ], unit="s", limit=("red", INTERACTIVE_OLDEST_WAIT_TARGET_S)),
    ])  # fmt: skip
    engine = row("Engine TTFT targets and seat bounds", [
        timeseries("Engine TTFT p vs target", "On each engine, the quantile "
                   "(GPUSHARE_TARGET_QUANTILE) of each class's latest times to first token "
                   "that its target's controller reads, against the target (dashed). Only "
                   "while a class has a target (GPUSHARE_TTFT_TARGETS_MS or `manage.py pool "
                   "targets`).", [
            target(f"gpushare_engine_ttft_p99_seconds{{{E}}}", "{{engine}} {{class}} p"),
            target(f"gpushare_engine_ttft_target_seconds{{{E}}}",
                   "{{engine}} {{class}} target"),
        ], unit="s", overrides=[dashed(".* target")]),
        timeseries("Seats below a class: bound vs held", "The seats the classes below a "
                   "class may hold on each engine (its controller's or fixed bound, dashed) "
                   "and those they hold: the controller lowers the bound while the TTFT p "
                   "is over target.", [
            target(f"gpushare_engine_seats_below{{{E}}}", "{{engine}} below {{class}} bound"),
            target(f"gpushare_engine_seats_below_held{{{E}}}",
                   "{{engine}} below {{class}} held"),
        ], overrides=[dashed(".* bound")]),
        sized(stat("Classes over their TTFT target", "Engine and class pairs whose TTFT p "
                   "is over its target now.", [
            target(f"count(gpushare_engine_ttft_p99_seconds{{{E}}} > on (engine, class) "
                   "gpushare_engine_ttft_target_seconds) or vector(0)", "over target"),
        ], steps=(("red", 1),)), 6),
    ])  # fmt: skip
    return dashboard(
        "gpushare-latency",
        "gpushare / Latency",
        "Latency and time to first token per class against the targets, queue waits, and "
        "the engines' TTFT targets with the seat bounds that hold them.",
        [
            query_variable(
                "model", "Model", "label_values(gpushare_request_latency_seconds_count, model)"
            ),
            query_variable(
                "tenant", "Tenant", "label_values(gpushare_request_latency_seconds_count, tenant)"
            ),
            query_variable("engine", "Engine", "label_values(gpushare_engine_class_seats, engine)"),
        ],
        [goals, requests, ttft, wait, engine],
    )


def render(board: dict[str, Any]) -> str:
    return json.dumps(board, indent=2) + "\n"


def dashboards() -> dict[str, dict[str, Any]]:
    """File name -> dashboard."""
    return {
        "gpushare-fleet.json": fleet(),
        "gpushare-tenants.json": tenants(),
        "gpushare-latency.json": latency(),
    }


if __name__ == "__main__":
    DASHBOARDS.mkdir(parents=True, exist_ok=True)
    for name, board in dashboards().items():
        (DASHBOARDS / name).write_text(render(board))
        print(f"wrote {(DASHBOARDS / name).relative_to(REPO)}")
