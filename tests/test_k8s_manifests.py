"""docker/k8s/: valid Kubernetes objects (checked offline against the API schemas that the
kubernetes-validate package ships), and the same deployment as docker/compose.yaml: images,
commands, ports, environment, health checks and the run volume agree, except where a cluster
needs something else (Curve keys instead of transport.insecure, actor ids from the StatefulSet,
httpGet probes on each role's health port, Prometheus scrape annotations).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from zmqrl.config import Config, load_config
from zmqrl.config_checks import health_http_problem, parse_http_address
from zmqrl.runtime.http_probe import HEALTHZ, READYZ

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason='kubernetes-validate is a dev dependency: pip install -e ".[dev]"'
)

REPO = Path(__file__).resolve().parents[1]
K8S = REPO / "docker" / "k8s"
COMPOSE = REPO / "docker" / "compose.yaml"
NAMESPACE = "zmqrl"
# The oldest release that labels StatefulSet pods with apps.kubernetes.io/pod-index (the actor ids
# come from it), and the newest whose schemas the package ships.
K8S_VERSIONS = ["1.28", kubernetes_validate.utils.latest_version()]
ROLES = ["supervisor", "learner", "actor", "evaluator"]  # processes of zmqrl itself
SERVICES = [*ROLES, "tensorboard"]
IMAGE_ENTRYPOINT = ["zmqrl"]  # docker/Dockerfile's ENTRYPOINT, which `args` leave in place
HEALTH = ["zmqrl", "health"]
KEYS_DIR = "/keys"
# The compose file's project network is private to it, so it runs the channels in plaintext with
# a control token (the supervisor's) and role keys derived from it, each on a volume of its own; a
# cluster network is shared, so the manifests use Curve keys (one client pair per role) instead.
COMPOSE_ONLY_ENV = {
    "ZMQRL_TRANSPORT__INSECURE",
    "ZMQRL_TRANSPORT__CONTROL_TOKEN_FILE",
    "ZMQRL_TRANSPORT__CONTROL_KEYS_DIR",
}
# The volumes compose mounts besides the run volume: the control secret (the supervisor's) and the
# role keys (each role its own).
COMPOSE_KEY_VOLUMES = {
    "supervisor": ["control-secret:/secret", *(f"keys-{r}:/keys/{r}" for r in ROLES[1:])],
    "learner": ["keys-learner:/keys/learner"],
    "actor": ["keys-actor:/keys/actor"],
    "evaluator": ["keys-evaluator:/keys/evaluator"],
}
K8S_ONLY_ENV = {"ZMQRL_TRANSPORT__KEYS_DIR"}
# Set by both, each to its own number of actors (compose: ${ZMQRL_ACTORS:-2}; k8s: the replicas).
LADDER_ENV = "ZMQRL_ACTOR__NUM_ACTORS"
# Set for the cluster whether or not compose sets them: where each role serves /healthz and
# /readyz for the kubelet (every role), and where the supervisor serves /metrics for Prometheus.
HEALTH_HTTP_ENV = "ZMQRL_SUPERVISOR__HEALTH_HTTP"
METRICS_HTTP_ENV = "ZMQRL_SUPERVISOR__METRICS_HTTP"
CLUSTER_ENV = {role: {HEALTH_HTTP_ENV} for role in ROLES} | {
    "supervisor": {HEALTH_HTTP_ENV, METRICS_HTTP_ENV}
}
# Processes whose pods the kubelet probes over HTTP (the supervisor serves the same probes).
HTTP_PROBED = ["supervisor", "learner", "actor", "evaluator"]
SCRAPED = "supervisor"  # the one pod Prometheus scrapes: every role's metrics are in its /metrics
# Arguments the manifests add: a replacement pod of these resumes from the run volume.
K8S_ONLY_ARGS = {"--resume"}
# Servers bind, so they get the server secret and the authorized list (one key per role); clients
# never do. Every pod holds one client pair: its role's (the supervisor's is the tools' `client`).
AUTHORIZED = {f"authorized/{name}.key" for name in ("client", "learner", "actor", "evaluator")}
OWN_PAIR = {"supervisor": "client", "learner": "learner", "actor": "actor", "evaluator": "evaluator"}


def expected_key_files(role: str) -> set[str]:
    own = OWN_PAIR[role]
    files = {"server.key", f"{own}.key", f"{own}.key_secret"}
    return files | {"server.key_secret", *AUTHORIZED} if role in ("learner", "supervisor") else files


# --------------------------------------------------------------------------------------------
# Reading both sides
# --------------------------------------------------------------------------------------------


def manifest_files() -> list[Path]:
    return sorted(K8S.glob("*.yaml"))


def load_objects() -> list[dict[str, Any]]:
    return [doc for path in manifest_files() for doc in yaml.safe_load_all(path.read_text()) if doc]


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name!r}, found {len(found)}"
    return found[0]


def workload(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    found = [
        o for o in objects if o["kind"] in ("Deployment", "StatefulSet") and o["metadata"]["name"] == name
    ]
    assert len(found) == 1, f"expected one workload {name!r}, found {len(found)}"
    return found[0]


def container(obj: dict[str, Any]) -> dict[str, Any]:
    containers = obj["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    result: dict[str, Any] = containers[0]
    return result


def effective_env(objects: list[dict[str, Any]], obj: dict[str, Any]) -> dict[str, Any]:
    """What the container's environment will hold: its ConfigMaps (envFrom), then its own ``env``,
    which wins; a value from the downward API is kept as its ``fieldRef`` path."""
    c = container(obj)
    env: dict[str, Any] = {}
    for source in c.get("envFrom", []):
        env.update(find(objects, "ConfigMap", source["configMapRef"]["name"])["data"])
    for item in c.get("env", []):
        env[item["name"]] = item["value"] if "value" in item else item["valueFrom"]["fieldRef"]["fieldPath"]
    return env


def interpolate(value: Any) -> Any:
    """Compose's ``${VAR:-default}`` with nothing set in the environment: the defaults."""
    if isinstance(value, str):
        return re.sub(r"\$\{\w+(?::?-([^}]*))?\}", lambda m: m.group(1) or "", value)
    if isinstance(value, list):
        return [interpolate(v) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v) for k, v in value.items()}
    return value


def compose_services() -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = interpolate(yaml.safe_load(COMPOSE.read_text()))["services"]
    return services


def seconds(duration: str) -> float:
    """A compose duration such as ``10s``, ``1m30s``."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(float(n) * units[u] for n, u in parts)


def port_of(endpoint: str) -> int:
    match = re.fullmatch(r"tcp://[^:]+:(\d+)", endpoint)
    assert match, endpoint
    return int(match.group(1))


def key_files(obj: dict[str, Any], mount_path: str) -> tuple[set[str], set[str]]:
    """(files, secrets) of the volume mounted at ``mount_path``: the paths it will hold and the
    Secrets they come from."""
    pod = obj["spec"]["template"]["spec"]
    (mount,) = [m for m in container(obj)["volumeMounts"] if m["mountPath"] == mount_path]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    sources = [s["secret"] for s in volume["projected"]["sources"]] if "projected" in volume else []
    if "secret" in volume:
        sources = [{**volume["secret"], "name": volume["secret"]["secretName"]}]
    files = {item["path"] for s in sources for item in s["items"]}
    return files, {s["name"] for s in sources}


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return load_objects()


@pytest.fixture(scope="module")
def compose() -> dict[str, dict[str, Any]]:
    return compose_services()


# --------------------------------------------------------------------------------------------
# Valid Kubernetes, offline
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_object_validates_against_the_kubernetes_schemas(
    objects: list[dict[str, Any]], version: str
) -> None:
    assert len(objects) >= 12
    errors = []
    for obj in objects:
        # Strict: an unknown or misspelled field fails too. A kind without a schema raises.
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:  # its str() dumps the whole schema
            where = ".".join(str(p) for p in exc.path)
            errors.append(f"{obj['kind']} {obj['metadata']['name']}: {where}: {exc.message}")
    assert not errors, "\n".join(errors)


def test_the_validation_catches_a_misspelled_field_and_a_wrong_type(objects: list[dict[str, Any]]) -> None:
    learner = workload(objects, "learner")
    misspelled = copy.deepcopy(learner)
    container(misspelled)["ports"][0]["containerport"] = container(misspelled)["ports"][0].pop(
        "containerPort"
    )
    wrong_type = copy.deepcopy(learner)
    wrong_type["spec"]["replicas"] = "one"
    for broken in (misspelled, wrong_type):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, K8S_VERSIONS[0], strict=True)


def test_files_apply_in_order_into_one_namespace(objects: list[dict[str, Any]]) -> None:
    """`kubectl apply -f docker/k8s/` takes the files in name order: the namespace first, then
    the config and the volume the workloads need."""
    first = [yaml.safe_load(p.read_text())["kind"] for p in manifest_files()[:3]]
    assert first == ["Namespace", "ConfigMap", "PersistentVolumeClaim"]
    assert find(objects, "Namespace", NAMESPACE)
    assert all(o["metadata"].get("namespace") == NAMESPACE for o in objects if o["kind"] != "Namespace")


def test_each_workload_selects_its_own_pods_and_each_service_its_workload(
    objects: list[dict[str, Any]],
) -> None:
    for name in SERVICES:
        obj = workload(objects, name)
        labels = obj["spec"]["template"]["metadata"]["labels"]
        assert obj["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert labels["app.kubernetes.io/component"] == name
    for service in (o for o in objects if o["kind"] == "Service"):
        selected = [
            w
            for w in objects
            if w["kind"] in ("Deployment", "StatefulSet")
            and service["spec"]["selector"].items() <= w["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert [w["metadata"]["name"] for w in selected] == [service["metadata"]["name"]]


# --------------------------------------------------------------------------------------------
# The same deployment as docker/compose.yaml
# --------------------------------------------------------------------------------------------


def test_the_same_services_run_the_same_image(
    objects: list[dict[str, Any]], compose: dict[str, dict[str, Any]]
) -> None:
    assert set(compose) == set(SERVICES)
    for name in SERVICES:
        assert container(workload(objects, name))["image"] == compose[name]["image"], name


def test_the_same_commands_run(objects: list[dict[str, Any]], compose: dict[str, dict[str, Any]]) -> None:
    for name in SERVICES:
        c = container(workload(objects, name))
        assert c.get("command", IMAGE_ENTRYPOINT) == compose[name].get("entrypoint", IMAGE_ENTRYPOINT), name
        args = [a for a in c["args"] if a not in K8S_ONLY_ARGS]
        assert args == [a for a in compose[name]["command"] if a not in K8S_ONLY_ARGS], name
    # Replacement pods continue the run instead of starting it over.
    for name in ("learner", "evaluator"):
        assert "--resume" in container(workload(objects, name))["args"]


def test_the_same_environment_configures_every_role(
    objects: list[dict[str, Any]], compose: dict[str, dict[str, Any]]
) -> None:
    for name in ROLES:
        obj = workload(objects, name)
        env = effective_env(objects, obj)
        expected = {k: str(v) for k, v in compose[name]["environment"].items() if k not in COMPOSE_ONLY_ENV}
        if name == "actor":
            # Unique per pod and kept by a replacement: the StatefulSet's ordinal.
            assert env.pop("ZMQRL_ACTOR_ID") == "metadata.labels['apps.kubernetes.io/pod-index']"
        k8s_only = {k: env.pop(k) for k in K8S_ONLY_ENV}
        assert env.pop(LADDER_ENV) and expected.pop(LADDER_ENV), name
        for key in CLUSTER_ENV[name]:
            assert key in env, (name, key)
            env.pop(key)
            expected.pop(key, None)
        assert env == expected, name
        assert k8s_only["ZMQRL_TRANSPORT__KEYS_DIR"] == KEYS_DIR
    assert effective_env(objects, workload(objects, "tensorboard")) == {}
    assert "environment" not in compose["tensorboard"]


def test_the_ladder_spans_as_many_actors_as_the_statefulset_runs(objects: list[dict[str, Any]]) -> None:
    actors = workload(objects, "actor")
    assert actors["kind"] == "StatefulSet"
    assert effective_env(objects, actors)[LADDER_ENV] == str(actors["spec"]["replicas"])
    assert actors["spec"]["replicas"] > 1


def test_compose_sizes_the_ladder_with_the_number_of_actor_replicas() -> None:
    raw = yaml.safe_load(COMPOSE.read_text())  # before interpolation: the same variable on both sides
    replicas = raw["services"]["actor"]["deploy"]["replicas"]
    assert replicas == "${ZMQRL_ACTORS:-2}"
    assert raw["x-env"][LADDER_ENV] == replicas


def test_services_expose_the_ports_the_endpoints_name(
    objects: list[dict[str, Any]], compose: dict[str, dict[str, Any]]
) -> None:
    """Each connect endpoint of compose (``tcp://learner:5555``) is a Service of that name with that
    port, forwarded to the port its server binds."""
    client_env = compose["actor"]["environment"]
    channels = {
        "SAMPLES": "learner",
        "WEIGHTS": "learner",
        "HEARTBEAT": "supervisor",
        "CONTROL": "supervisor",
    }
    for channel, server in channels.items():
        endpoint = client_env[f"ZMQRL_TRANSPORT__{channel}"]
        assert endpoint.startswith(f"tcp://{server}:")
        port = port_of(endpoint)
        service = find(objects, "Service", server)
        (sp,) = [p for p in service["spec"]["ports"] if p["port"] == port]
        (cp,) = [p for p in container(workload(objects, server))["ports"] if p["name"] == sp["targetPort"]]
        assert cp["containerPort"] == port
        bind = effective_env(objects, workload(objects, server))[f"ZMQRL_TRANSPORT__{channel}"]
        assert (
            bind == compose[server]["environment"][f"ZMQRL_TRANSPORT__{channel}"] == f"tcp://0.0.0.0:{port}"
        )
    tb_port = int(compose["tensorboard"]["command"][compose["tensorboard"]["command"].index("--port") + 1])
    assert compose["tensorboard"]["ports"] == [f"127.0.0.1:{tb_port}:{tb_port}"]
    (sp,) = find(objects, "Service", "tensorboard")["spec"]["ports"]
    assert sp["port"] == tb_port
    assert container(workload(objects, "tensorboard"))["ports"] == [
        {"name": "http", "containerPort": tb_port}
    ]


def test_probes_run_the_compose_healthcheck_on_the_same_schedule(
    objects: list[dict[str, Any]], compose: dict[str, dict[str, Any]]
) -> None:
    for name in SERVICES:
        c = container(workload(objects, name))
        check = compose[name]["healthcheck"]
        if name in HTTP_PROBED:
            assert check["test"] == ["CMD", *HEALTH]
            assert c["startupProbe"]["httpGet"] == {"path": HEALTHZ, "port": "health"}, name
            assert c["livenessProbe"]["httpGet"] == {"path": HEALTHZ, "port": "health"}, name
            assert c["readinessProbe"]["httpGet"] == {"path": READYZ, "port": "health"}, name
        elif name in ROLES:
            assert check["test"] == ["CMD", *HEALTH]
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                assert c[probe]["exec"]["command"] == HEALTH, (name, probe)
        else:  # TensorBoard answers HTTP on its port
            assert f"http://127.0.0.1:{c['ports'][0]['containerPort']}/" in " ".join(check["test"])
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                assert c[probe]["httpGet"] == {"path": "/", "port": "http"}, (name, probe)
        live, start = c["livenessProbe"], c["startupProbe"]
        assert live["periodSeconds"] == seconds(check["interval"]), name
        assert live["timeoutSeconds"] == start["timeoutSeconds"] == seconds(check["timeout"]), name
        assert live["failureThreshold"] == check["retries"], name
        assert start["periodSeconds"] * start["failureThreshold"] == seconds(check["start_period"]), name


def test_roles_stop_with_the_same_grace_and_share_the_run_volume(
    objects: list[dict[str, Any]], compose: dict[str, dict[str, Any]]
) -> None:
    claim = find(objects, "PersistentVolumeClaim", "zmqrl-runs")
    assert "ReadWriteMany" in claim["spec"]["accessModes"]
    for name in SERVICES:
        obj = workload(objects, name)
        runs = "runs:/runs:ro" if name == "tensorboard" else "runs:/runs"  # it only reads
        assert compose[name]["volumes"] == [runs, *COMPOSE_KEY_VOLUMES.get(name, [])], name
        pod = obj["spec"]["template"]["spec"]
        (mount,) = [m for m in container(obj)["volumeMounts"] if m["mountPath"] == "/runs"]
        (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        assert volume["persistentVolumeClaim"]["claimName"] == "zmqrl-runs"
        assert pod["securityContext"]["runAsUser"] == 1000  # the image's user, owner of /runs
        if name in ROLES:
            assert effective_env(objects, obj)["ZMQRL_RUN__DIR"] == "/runs"
            assert pod["terminationGracePeriodSeconds"] == seconds(compose[name]["stop_grace_period"]), name


def test_only_the_servers_get_the_server_secret_and_each_role_only_its_own_client_secret(
    objects: list[dict[str, Any]],
) -> None:
    """docs/deployment.md "Security": the learner and supervisor bind (server pair and authorized
    list); every pod holds one client secret, its role's, so its heartbeats can only speak as its
    role (an actor pod cannot end the run as the learner)."""
    for name in ROLES:
        files, secrets = key_files(workload(objects, name), KEYS_DIR)
        assert files == expected_key_files(name), name
        own = {"zmqrl-keys", f"zmqrl-key-{OWN_PAIR[name]}"}
        assert secrets == (own | {"zmqrl-server-key"} if name in ("learner", "supervisor") else own), name
        secret_files = {f for f in files if f.endswith(".key_secret")}
        assert secret_files - {"server.key_secret"} == {f"{OWN_PAIR[name]}.key_secret"}, name


# --------------------------------------------------------------------------------------------
# Health over HTTP and Prometheus scraping
# --------------------------------------------------------------------------------------------


def named_port(obj: dict[str, Any], name: str) -> int:
    (port,) = [p["containerPort"] for p in container(obj).get("ports", []) if p["name"] == name]
    return int(port)


def role_config(objects: list[dict[str, Any]], obj: dict[str, Any]) -> Config:
    """The config the pod's role runs with: its environment over the defaults (as in the image)."""
    env = {k: str(v) for k, v in effective_env(objects, obj).items()}
    return load_config(None, [], environ=env)


def test_each_probed_role_serves_its_health_on_the_port_its_probes_ask(objects: list[dict[str, Any]]) -> None:
    """The variable really sets supervisor.health_http (a misspelt one would leave it off and every
    probe refused), on every interface (the kubelet comes over the pod's IP) and a fixed port that
    is the container's `health` port."""
    for name in HTTP_PROBED:
        obj = workload(objects, name)
        cfg = role_config(objects, obj)
        assert cfg.supervisor.health_http is not None and health_http_problem(cfg) is None, name
        host, port = parse_http_address(cfg.supervisor.health_http)
        assert host == "0.0.0.0" and port != 0, name
        assert named_port(obj, "health") == port, name


def test_only_the_supervisor_pod_is_scraped_on_the_port_its_metrics_bind(
    objects: list[dict[str, Any]],
) -> None:
    for name in SERVICES:
        annotations = workload(objects, name)["spec"]["template"]["metadata"].get("annotations", {})
        assert annotations.get("prometheus.io/scrape") == ("true" if name == SCRAPED else "false"), name
    supervisor = workload(objects, SCRAPED)
    annotations = supervisor["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/path"] == "/metrics"
    cfg = role_config(objects, supervisor)
    assert cfg.supervisor.metrics_http is not None
    host, port = parse_http_address(cfg.supervisor.metrics_http)
    assert host == "0.0.0.0", "Prometheus scrapes the pod's IP: loopback (the default) would refuse it"
    assert annotations["prometheus.io/port"] == str(port) == str(named_port(supervisor, "metrics"))
    (sp,) = [p for p in find(objects, "Service", SCRAPED)["spec"]["ports"] if p["name"] == "metrics"]
    assert (sp["port"], sp["targetPort"]) == (port, "metrics")
