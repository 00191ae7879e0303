"""platform/k8s's overlays as `kubectl kustomize` renders them: every object valid against the
Kubernetes schemas (kubernetes-validate's, offline), the pods' references resolved, the
probes and scrapes answered by the web, and the migrate Job ahead of every new pod.
Without kubectl on PATH these tests are skipped (tests/test_platform_files.py still reads
the base's files)."""

from __future__ import annotations

import base64
import importlib.util
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import kubernetes_validate
import pytest
import yaml
from django.http.request import validate_host
from redis.connection import parse_url

from config.health import READINESS_CHECKS

K8S = Path(__file__).resolve().parent.parent / "platform" / "k8s"
SCRIPTS = K8S.parent.parent / "scripts"
OVERLAYS = ["development", "production", "sentinel"]
# The oldest Kubernetes the manifests are meant for, and the newest the schemas know.
KUBERNETES_VERSIONS = ["1.29", kubernetes_validate.latest_version()]
PODS = {"Deployment", "DaemonSet", "StatefulSet", "Job"}

kubectl = shutil.which("kubectl")
pytestmark = pytest.mark.skipif(kubectl is None, reason="kubectl (for `kubectl kustomize`)")

# Prometheus Operator's CRDs are not in kubernetes-validate's schemas (they are the
# operator's, not Kubernetes'): their objects are checked against the fields used here, as
# the operator's CRDs (monitoring.coreos.com/v1) define them.
_AUTHORIZATION: dict[str, Any] = {
    "type": "object",
    "required": ["type", "credentials"],
    "properties": {
        "type": {"const": "Bearer"},
        "credentials": {"type": "object", "required": ["name", "key"]},
    },
}
_ENDPOINT = {
    "type": "object",
    "required": ["port", "path"],
    "additionalProperties": False,
    "properties": {
        "port": {"type": "string"},
        "path": {"type": "string"},
        "interval": {"type": "string", "pattern": "^[0-9]+[smh]$"},
        "authorization": _AUTHORIZATION,
    },
}
MONITOR_SCHEMAS = {
    kind: {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "metadata": {"type": "object", "required": ["name", "namespace"]},
            "spec": {
                "type": "object",
                "required": ["selector", endpoints],
                "additionalProperties": False,
                "properties": {
                    "selector": {"type": "object", "required": ["matchLabels"]},
                    endpoints: {"type": "array", "minItems": 1, "items": _ENDPOINT},
                },
            },
        },
    }
    for kind, endpoints in (("ServiceMonitor", "endpoints"), ("PodMonitor", "podMetricsEndpoints"))
}
MONITOR_SCHEMAS["PrometheusRule"] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "metadata": {"type": "object", "required": ["name", "namespace"]},
        "spec": {
            "type": "object",
            "required": ["groups"],
            "additionalProperties": False,
            "properties": {
                "groups": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["name", "rules"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string"},
                            "interval": {"type": "string", "pattern": "^[0-9]+[smh]$"},
                            "rules": {
                                "type": "array",
                                "minItems": 1,
                                "items": {
                                    "type": "object",
                                    "required": ["expr"],
                                    "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                                    "additionalProperties": False,
                                    "properties": {
                                        "alert": {"type": "string"},
                                        "record": {"type": "string"},
                                        "expr": {"type": "string"},
                                        "for": {"type": "string", "pattern": "^[0-9]+[smh]$"},
                                        "labels": {
                                            "type": "object",
                                            "additionalProperties": {"type": "string"},
                                        },
                                        "annotations": {
                                            "type": "object",
                                            "additionalProperties": {"type": "string"},
                                        },
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}
MONITOR_SCHEMAS["ScrapeConfig"] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1alpha1"},
        "metadata": {"type": "object", "required": ["name", "namespace"]},
        "spec": {
            "type": "object",
            "required": ["metricsPath", "staticConfigs"],
            "additionalProperties": False,
            "properties": {
                "metricsPath": {"type": "string"},
                "scrapeInterval": {"type": "string", "pattern": "^[0-9]+[smh]$"},
                "staticConfigs": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["targets"],
                        "additionalProperties": False,
                        "properties": {"targets": {"type": "array", "items": {"type": "string"}}},
                    },
                },
                "authorization": _AUTHORIZATION,
            },
        },
    },
}


@cache
def render(overlay: str) -> tuple[dict[str, Any], ...]:
    assert kubectl is not None
    out = subprocess.run(
        [kubectl, "kustomize", str(K8S / overlay)], capture_output=True, text=True, check=True
    ).stdout
    return tuple(doc for doc in yaml.safe_load_all(out) if doc)


def one(overlay: str, kind: str, name: str) -> dict[str, Any]:
    found = [d for d in render(overlay) if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, (overlay, kind, name)
    return found[0]


def pod_specs(overlay: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(d, d["spec"]["template"]["spec"]) for d in render(overlay) if d["kind"] in PODS]


def secret_keys(overlay: str) -> set[str]:
    """The Secret `gpushare`'s keys: the overlay's own, or the example production creates."""
    rendered = [
        d for d in render(overlay) if d["kind"] == "Secret" and d["metadata"]["name"] == "gpushare"
    ]
    if rendered:
        return set(rendered[0]["data"])
    example = yaml.safe_load((K8S / overlay / "secret.example.yaml").read_text())
    return set(example["stringData"])


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' $(NAME) in an env value: the value of NAME defined before it."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), value)


def container_env(overlay: str, container: dict[str, Any], pod_ip: str) -> dict[str, str]:
    """The environment a container starts with, as the kubelet builds it: envFrom's first,
    then env in order, each $(NAME) expanded."""
    config = one(overlay, "ConfigMap", "gpushare")["data"]
    env = {k: v for ref in container.get("envFrom", []) if "configMapRef" in ref
           for k, v in config.items()}  # fmt: skip
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = expand(var["value"], env)
        elif var["valueFrom"].get("fieldRef", {}).get("fieldPath") == "status.podIP":
            env[var["name"]] = pod_ip
    return env


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_of_an_overlay_is_valid_kubernetes(overlay, version):
    kinds = set()
    for doc in render(overlay):
        kinds.add(doc["kind"])
        assert doc["metadata"].get("namespace", "gpushare") == "gpushare", doc["metadata"]
        if doc["kind"] in MONITOR_SCHEMAS:
            import jsonschema

            jsonschema.validate(doc, MONITOR_SCHEMAS[doc["kind"]])
            continue
        # strict: an unknown field (a typo, a field of another version) is an error too.
        kubernetes_validate.validate(doc, version, strict=True)
    assert {"Namespace", "ConfigMap", "Job", "Deployment", "DaemonSet", "Service"} <= kinds


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_finds_its_config_secret_and_volumes(overlay):
    names = {(d["kind"], d["metadata"]["name"]) for d in render(overlay)}
    assert ("ConfigMap", "gpushare") in names
    assert {"DATABASE_URL", "REDIS_URL", "DJANGO_SECRET_KEY"} <= secret_keys(overlay)
    for doc, spec in pod_specs(overlay):
        for volume in spec.get("volumes", []):
            if "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                assert ("PersistentVolumeClaim", claim) in names, (doc["metadata"], claim)
        mounted = {v["name"] for c in spec["containers"] for v in c.get("volumeMounts", [])}
        claims = doc["spec"].get("volumeClaimTemplates", [])  # a StatefulSet's own volumes
        volumes = {v["name"] for v in spec.get("volumes", [])} | {
            c["metadata"]["name"] for c in claims
        }
        assert mounted <= volumes, doc["metadata"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_new_pod_waits_for_the_migrate_job_of_its_image(overlay):
    job = one(overlay, "Job", "migrate")
    # A finished Job goes away by itself, so a later `apply` with a new image creates it again.
    assert job["spec"]["ttlSecondsAfterFinished"] > 0
    migrate = job["spec"]["template"]["spec"]["containers"][0]
    assert migrate["command"][:3] == ["python", "manage.py", "migrate"]
    for doc, spec in pod_specs(overlay):
        if doc["metadata"]["labels"].get("app.kubernetes.io/name") != "gpushare" or doc is job:
            continue
        (wait,) = spec["initContainers"]
        assert "manage.py migrate --check" in wait["command"][-1]
        assert wait["image"] == spec["containers"][0]["image"]
        assert wait["envFrom"] == spec["containers"][0]["envFrom"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_web_pods_probes_are_answered_at_the_pods_address(overlay):
    web = one(overlay, "Deployment", "web")["spec"]["template"]["spec"]["containers"][0]
    readiness = urlsplit(web["readinessProbe"]["httpGet"]["path"])
    assert readiness.path == "/readyz"
    # Ready without an engine (the console registers them), not without the database or Redis.
    assert parse_qs(readiness.query) == {"exclude": ["engines"]}
    assert set(READINESS_CHECKS) - {"engines"} == {"database", "redis"}
    assert web["livenessProbe"]["httpGet"]["path"] == "/healthz"
    # The kubelet and Prometheus send Host: <pod IP>:<port>; Django must allow it, and the
    # names of the ConfigMap still.
    env = container_env(overlay, web, pod_ip="10.42.7.9")
    allowed = env["DJANGO_ALLOWED_HOSTS"].split(",")
    assert validate_host("10.42.7.9", allowed)
    config = one(overlay, "ConfigMap", "gpushare")["data"]["DJANGO_ALLOWED_HOSTS"]
    assert all(validate_host(host, allowed) for host in config.split(","))
    assert "$(" not in env["DJANGO_ALLOWED_HOSTS"]


def test_development_runs_its_own_postgres_and_redis_with_an_append_only_file():
    assert {"DATABASE_URL", "REDIS_URL"} <= set(secret_keys("development"))
    assert one("development", "Service", "postgres")["spec"]["ports"][0]["port"] == 5432
    redis = one("development", "StatefulSet", "redis")["spec"]["template"]["spec"]
    command = redis["containers"][0]["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--appendfsync") + 1] == "everysec"


def secret_value(overlay: str, name: str, key: str) -> str:
    return base64.b64decode(one(overlay, "Secret", name)["data"][key]).decode()


def test_development_redis_answers_only_with_the_password_every_platform_pod_carries():
    """Whoever writes to Redis controls the fair queue, the limits and Celery's messages."""
    redis = one("development", "StatefulSet", "redis")["spec"]["template"]["spec"]
    (container,) = redis["containers"]
    command = container["command"]
    assert "--requirepass" in command, "Redis must ask for a password"
    reference = re.fullmatch(r"\$\(([A-Z_]+)\)", command[command.index("--requirepass") + 1])
    assert reference, "the password comes from the Secret, not the manifest"
    env = {e["name"]: e for e in container["env"]}
    secret = env[reference[1]]["valueFrom"]["secretKeyRef"]
    password = secret_value("development", secret["name"], secret["key"])
    assert len(password) >= 16
    # The readiness probe authenticates (redis-cli's REDISCLI_AUTH) and wants PONG.
    assert expand(env["REDISCLI_AUTH"]["value"], {reference[1]: password}) == password
    assert "PONG" in container["readinessProbe"]["exec"]["command"][-1]
    # Every platform pod takes REDIS_URL from the Secret gpushare (envFrom): it carries it.
    url = parse_url(secret_value("development", "gpushare", "REDIS_URL"))
    assert url["password"] == password
    assert url["host"] == one("development", "Service", "redis")["metadata"]["name"]
    for doc, spec in pod_specs("development"):
        if doc["metadata"]["labels"].get("app.kubernetes.io/name") == "gpushare":
            for c in spec["containers"]:
                assert {"secretRef": {"name": "gpushare"}} in c["envFrom"], doc["metadata"]


def test_sentinel_runs_a_primary_a_replica_and_three_sentinels_the_platform_asks():
    """platform/k8s/sentinel: development's Redis under Redis Sentinel. The platform's pods
    ask the sentinels for the primary of the service they watch, and fence the fair queue
    on the replica; the primary refuses writes no replica has (min-replicas-to-write)."""
    redis = one("sentinel", "StatefulSet", "redis")["spec"]
    sentinels = one("sentinel", "StatefulSet", "redis-sentinel")["spec"]
    assert (redis["replicas"], sentinels["replicas"]) == (2, 3)
    for spec in (redis, sentinels):  # each pod has a name of its own the others resolve
        service = one("sentinel", "Service", spec["serviceName"])["spec"]
        assert service["clusterIP"] == "None"
        assert selects({"matchLabels": service["selector"]}, spec["template"]["metadata"]["labels"])
    (server,) = redis["template"]["spec"]["containers"]
    script = server["command"][-1]
    # Development's Redis options hold under Sentinel too (its command is replaced here).
    development = one("development", "StatefulSet", "redis")["spec"]["template"]["spec"]
    options = [arg for arg in development["containers"][0]["command"] if arg.startswith("--")]
    assert [option for option in options if option not in script] == []
    for option in ("--appendonly yes", "--appendfsync everysec", '--requirepass "$REDIS_PASSWORD"',
                   '--masterauth "$REDIS_PASSWORD"', "--min-replicas-to-write 1"):  # fmt: skip
        assert option in script
    (sentinel,) = sentinels["template"]["spec"]["containers"]
    conf = sentinel["command"][-1]
    monitor = re.search(r"sentinel monitor (\S+) \S+ 6379 (\d+)", conf)
    assert monitor is not None
    assert monitor[2] == "2"  # a quorum of two of the three
    assert "sentinel auth-pass" in conf
    config = one("sentinel", "ConfigMap", "gpushare")["data"]
    assert config["GPUSHARE_REDIS_SENTINEL_MASTER"] == monitor[1]
    assert f"get-master-addr-by-name {monitor[1]}" in script
    assert config["GPUSHARE_REDIS_REPLICAS_ACK"] == "1"
    pods = config["GPUSHARE_REDIS_SENTINELS"].split(",")
    assert pods == [f"redis-sentinel-{i}.{sentinels['serviceName']}:26379" for i in range(3)]
    port = sentinel["ports"][0]["containerPort"]
    assert port == 26379
    # The platform's pods reach the sentinels, and the Redis pods and sentinels each other.
    for name, port in (("redis", 6379), ("redis-sentinel", 26379)):
        policy = one("sentinel", "NetworkPolicy", name)["spec"]
        admitted = {
            doc["metadata"]["name"]
            for doc in render("sentinel")
            if doc["kind"] in PODS
            for rule in policy["ingress"]
            for peer in rule["from"]
            if selects(peer["podSelector"], doc["spec"]["template"]["metadata"]["labels"])
        }
        assert admitted == {"web", "beat", "gpu-node", "engine-agent", "redis", "redis-sentinel"}
        assert [r["ports"] for r in policy["ingress"]] == [[{"port": port, "protocol": "TCP"}]]


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a Kubernetes label selector selects `labels` (an empty one selects all)."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get("values")
        present = key in labels
        if not {
            "In": present and labels.get(key) in (values or []),
            "NotIn": not present or labels[key] not in (values or []),
            "Exists": present,
            "DoesNotExist": not present,
        }[operator]:
            return False
    return True


@pytest.mark.parametrize(
    ("database", "port", "clients"),
    [
        ("postgres", 5432, {"web", "beat", "migrate", "gpu-node", "engine-agent"}),
        ("redis", 6379, {"web", "beat", "gpu-node", "engine-agent"}),
    ],
)
def test_development_databases_admit_only_the_platforms_pods(database, port, clients):
    policy = one("development", "NetworkPolicy", database)["spec"]
    server = one("development", "StatefulSet", database)["spec"]["template"]["metadata"]
    assert selects(policy["podSelector"], server["labels"])
    assert policy["policyTypes"] == ["Ingress"]
    admitted = set()
    for rule in policy["ingress"]:
        assert rule["ports"] == [{"port": port, "protocol": "TCP"}]
        assert rule.get("from"), "a rule without `from` admits any source"
        for peer in rule["from"]:
            # By label only: an ipBlock or a namespaceSelector admits what is not the platform.
            assert set(peer) == {"podSelector"}, peer
            assert peer["podSelector"], "an empty podSelector admits every pod"
            admitted |= {
                doc["metadata"]["name"]
                for doc in render("development")
                if doc["kind"] in PODS
                and selects(peer["podSelector"], doc["spec"]["template"]["metadata"]["labels"])
            }
    assert admitted == clients


def test_production_is_scraped_by_prometheus_operator_with_the_metrics_token():
    monitor = one("production", "ServiceMonitor", "gpushare-web")
    service = one("production", "Service", "web")
    labels = service["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    credentials = endpoint["authorization"]["credentials"]
    assert credentials == {"name": "gpushare", "key": "GPUSHARE_METRICS_TOKEN"}
    assert credentials["key"] in secret_keys("production")

    pods = one("production", "PodMonitor", "gpushare-engines")
    agent = one("production", "DaemonSet", "engine-agent")["spec"]["template"]
    assert pods["spec"]["selector"]["matchLabels"].items() <= agent["metadata"]["labels"].items()
    # Each engine's own /metrics: one endpoint per engine port of the agent, all of them.
    ports = {p["name"] for p in agent["spec"]["containers"][0]["ports"]}
    endpoints = pods["spec"]["podMetricsEndpoints"]
    assert {e["port"] for e in endpoints} == ports
    assert len(ports) >= 8
    assert {e["path"] for e in endpoints} == {"/metrics"}
    # With the scrape token, which opens an engine's /metrics and nothing else.
    engine_token = {"name": "gpushare", "key": "GPUSHARE_ENGINE_METRICS_TOKEN"}
    assert all(e["authorization"]["credentials"] == engine_token for e in endpoints)
    assert engine_token["key"] in secret_keys("production")


def test_production_scrapes_the_cluster_wide_metrics_once_through_the_service():
    scrape = one("production", "ScrapeConfig", "gpushare-cluster")["spec"]
    assert scrape["metricsPath"] == "/metrics/cluster"
    (static,) = scrape["staticConfigs"]
    (target,) = static["targets"]  # one target: each series once, whatever the web replicas
    host, port = target.rsplit(":", 1)
    service = one("production", "Service", "web")
    assert host == f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert int(port) in {p["port"] for p in service["spec"]["ports"]}
    config = one("production", "ConfigMap", "gpushare")["data"]
    assert host in config["DJANGO_ALLOWED_HOSTS"].split(",")
    assert scrape["authorization"]["credentials"]["key"] in secret_keys("production")
    monitored = [m for m in render("production") if m["kind"] in ("ServiceMonitor", "PodMonitor")]
    paths = {e["path"] for m in monitored for e in m["spec"].get("endpoints", [])}
    assert "/metrics/cluster" not in paths  # a per-pod scrape of it would double every sum


def test_production_sets_images_replicas_and_whole_gpu_nodes():
    images = {
        c["image"]
        for _, spec in pod_specs("production")
        for c in spec.get("initContainers", []) + spec["containers"]
    }
    assert all(image.startswith("registry.example.com/") for image in images), images
    assert len({image.rsplit(":", 1)[1] for image in images}) == 1  # one release
    assert one("production", "Deployment", "web")["spec"]["replicas"] >= 2
    assert one("production", "Deployment", "beat")["spec"]["replicas"] == 1
    agent = one("production", "DaemonSet", "engine-agent")["spec"]["template"]["spec"]
    assert agent["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] > 1
    # No PostgreSQL or Redis of its own: the Secret names the cluster's.
    assert not [d for d in render("production") if d["kind"] in {"StatefulSet", "Secret"}]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_engines_are_the_agents_and_no_worker_holds_a_gpu_or_an_engine_port(overlay):
    agent = one(overlay, "DaemonSet", "engine-agent")
    spec = agent["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["command"] == ["/usr/local/bin/gpushare-node"]  # `gpus discover` first
    assert container["args"][:3] == ["python", "-m", "agent"]
    # Its engines die with its pod: drained first, and only when an operator deletes it.
    assert "--drain-on-exit" in container["args"]
    assert agent["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert spec["terminationGracePeriodSeconds"] >= 120
    assert spec["hostNetwork"] is True  # engines are reached at the node's address
    assert container["resources"]["limits"]["nvidia.com/gpu"] >= 1
    assert [p["containerPort"] for p in container["ports"]] == list(range(8100, 8108))
    env = {e["name"]: e for e in container["env"]}
    assert env["GPUSHARE_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    worker = one(overlay, "DaemonSet", "gpu-node")["spec"]["template"]["spec"]
    assert worker["nodeSelector"] == spec["nodeSelector"]  # beside the agent, same node name
    for doc, pod in pod_specs(overlay):
        if doc is agent:
            continue
        for c in pod["containers"]:
            assert "nvidia.com/gpu" not in c.get("resources", {}).get("limits", {}), doc
            assert "agent" not in c.get("args", []) + c.get("command", []), doc


def test_production_serves_the_web_through_an_ingress_on_its_public_name():
    ingress = one("production", "Ingress", "web")["spec"]
    service = one("production", "Service", "web")
    config = one("production", "ConfigMap", "gpushare")["data"]
    (rule,) = ingress["rules"]
    (tls,) = ingress["tls"]
    assert tls["hosts"] == [rule["host"]]
    assert tls["secretName"]
    assert validate_host(rule["host"], config["DJANGO_ALLOWED_HOSTS"].split(","))
    assert f"https://{rule['host']}" in config["DJANGO_CSRF_TRUSTED_ORIGINS"].split(",")
    (path,) = rule["http"]["paths"]
    assert (path["path"], path["pathType"]) == ("/", "Prefix")
    backend = path["backend"]["service"]
    assert backend["name"] == service["metadata"]["name"]
    assert backend["port"]["name"] in {p["name"] for p in service["spec"]["ports"]}
    annotations = one("production", "Ingress", "web")["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"  # streams


def test_production_alerts_with_the_very_rules_promtool_tests():
    spec = importlib.util.spec_from_file_location("prometheus_rule", SCRIPTS / "prometheus_rule.py")
    assert spec is not None
    assert spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)

    rule = one("production", "PrometheusRule", "gpushare")
    rules = script.RULES.read_text()
    assert rule["spec"] == script.prometheus_rule(rules)["spec"], "run scripts/prometheus_rule.py"
    assert script.TARGET.read_text() == script.render(rules)
    assert rule["metadata"]["labels"]["app.kubernetes.io/name"] == "gpushare"
