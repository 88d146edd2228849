"""The Helm chart (ops/helm/engram) lints and renders with the default and the production-like values, and
every rendered workload is fit to run: resources, liveness and readiness probes, a non-root security
context, and no secret in a plain ``env`` value or a ConfigMap. Needs ``helm`` (ops/test.sh builds it
from the Go module proxy when it is missing); without it the tests fail, they are not skipped."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "ops" / "helm" / "engram"
PRODUCTION = CHART / "values-production.yaml"
SECRET_NAMES = {
    "REDIS_URL",
    "ENGRAM_REDIS_SENTINEL_PASSWORD",
    "NEO4J_PASSWORD",
    "LLM_API_KEY",
    "ENGRAM_API_KEYS",
    "ENGRAM_API_KEY",
}
# Values only the chart-made Secret may hold; found anywhere else they leaked.
PLANTED = {
    "REDIS_URL": "redis://default:planted-redis-pw@redis:6379/0",
    "NEO4J_PASSWORD": "planted-neo4j-pw",
    "LLM_API_KEY": "sk-planted-llm-key",
    "ENGRAM_API_KEYS": '[{"name":"app","sha256":"' + "a" * 64 + '","scopes":["read"],"namespace":"app"}]',
}
# The secrets each workload gets: only those it uses.
REDIS = {"REDIS_URL", "ENGRAM_REDIS_SENTINEL_PASSWORD"}
USES = {
    "extract": {*REDIS, "NEO4J_PASSWORD", "LLM_API_KEY"},
    "apply": {*REDIS, "NEO4J_PASSWORD"},
    "maintenance": {*REDIS, "NEO4J_PASSWORD"},
    "beat": REDIS,
    "gateway": {*REDIS, "NEO4J_PASSWORD", "ENGRAM_API_KEYS"},
}
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob"}
COMPONENTS = {"extract", "apply", "maintenance", "beat", "gateway"}


def helm_binary() -> str:
    found = shutil.which("helm")
    if found is None:
        gopath = subprocess.run(["go", "env", "GOPATH"], capture_output=True, text=True).stdout.strip()
        candidate = Path(gopath or Path.home() / "go") / "bin" / "helm"
        found = str(candidate) if candidate.exists() else None
    if found is None:
        pytest.fail("helm not found: ops/test.sh builds it (go install helm.sh/helm/v4/cmd/helm@v4.3.2)")
    return found


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HELM_CACHE_HOME": "/tmp/helm-cache", "HELM_CONFIG_HOME": "/tmp/helm-config"}
    result = subprocess.run([helm_binary(), *args], capture_output=True, text=True, env=env, timeout=300)
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


def render(*args: str) -> list[dict[str, Any]]:
    out = helm("template", "engram", str(CHART), *args).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


VALUE_SETS = ("default", "production")


@pytest.fixture(scope="module")
def value_args(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """helm arguments per value set: the defaults (plus planted secrets in the chart-made Secret), production."""
    planted = tmp_path_factory.mktemp("helm") / "planted.yaml"
    planted.write_text(yaml.safe_dump({"secrets": {"values": PLANTED}}))
    return {"default": ["-f", str(planted)], "production": ["-f", str(PRODUCTION)]}


@pytest.fixture(scope="module", params=VALUE_SETS)
def rendered(request: pytest.FixtureRequest, value_args: dict[str, list[str]]) -> list[dict[str, Any]]:
    return render(*value_args[request.param])


def pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    if doc["kind"] == "CronJob":
        return doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return doc["spec"]["template"]["spec"]


def workloads(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] in WORKLOAD_KINDS]


def component(doc: dict[str, Any]) -> str:
    return doc["metadata"]["labels"]["app.kubernetes.io/component"]


@pytest.mark.parametrize("values", VALUE_SETS)
def test_the_chart_lints(values: str, value_args: dict[str, list[str]]) -> None:
    result = helm("lint", "--strict", str(CHART), *value_args[values])
    assert "0 chart(s) failed" in result.stdout


def test_every_component_is_rendered(rendered: list[dict[str, Any]]) -> None:
    assert {component(d) for d in workloads(rendered)} == COMPONENTS
    services = [d for d in rendered if d["kind"] == "Service"]
    assert [component(s) for s in services] == ["gateway"]
    budgets = {component(d) for d in rendered if d["kind"] == "PodDisruptionBudget"}
    assert budgets == COMPONENTS


def test_every_container_has_requests_limits_and_both_probes(rendered: list[dict[str, Any]]) -> None:
    for doc in workloads(rendered):
        for container in pod_spec(doc)["containers"]:
            where = f"{doc['metadata']['name']}/{container['name']}"
            for bound in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(container["resources"][bound]), f"{where}: {bound}"
            assert container["livenessProbe"] and container["readinessProbe"], where
            # Liveness checks no dependency; readiness does: they are never the same check.
            assert container["livenessProbe"] != container["readinessProbe"], where


def test_every_pod_runs_as_non_root_with_nothing_to_escalate(rendered: list[dict[str, Any]]) -> None:
    for doc in workloads(rendered):
        spec = pod_spec(doc)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["automountServiceAccountToken"] is False
        for container in spec["containers"]:
            context = container["securityContext"]
            assert context["runAsNonRoot"] is True and context["allowPrivilegeEscalation"] is False
            assert context["readOnlyRootFilesystem"] is True
            assert context["capabilities"]["drop"] == ["ALL"]
            # A read-only root needs a writable /tmp (heartbeats, Prometheus' multiprocess files).
            assert "/tmp" in {m["mountPath"] for m in container["volumeMounts"]}


def test_no_secret_in_plain_env_or_a_config_map(rendered: list[dict[str, Any]]) -> None:
    for doc in workloads(rendered):
        for container in pod_spec(doc)["containers"]:
            names = set()
            for var in container.get("env", []):
                names.add(var["name"])
                if var["name"] in SECRET_NAMES:
                    assert "value" not in var and "secretKeyRef" in var["valueFrom"], var
                else:
                    assert not any(secret in str(var.get("value", "")) for secret in PLANTED.values()), var
            assert names & SECRET_NAMES == USES[component(doc)], f"{component(doc)} gets {names & SECRET_NAMES}"
    for config in (d for d in rendered if d["kind"] == "ConfigMap"):
        assert not SECRET_NAMES & set(config["data"])
        assert not any(secret in str(config["data"]) for secret in PLANTED.values())
    # The planted values reach the chart-made Secret (production names an existing one) and nothing else.
    made = [d["stringData"] for d in rendered if d["kind"] == "Secret"]
    assert made in ([PLANTED], [])
    outside = [d for d in rendered if d["kind"] != "Secret"]
    assert not any(secret in yaml.safe_dump_all(outside) for secret in PLANTED.values())


def test_a_secret_in_config_or_env_refuses_to_render() -> None:
    for where in ("config.LLM_API_KEY", "workers.apply.env.REDIS_URL"):
        result = helm("template", "engram", str(CHART), "--set", f"{where}=leaked", check=False)
        assert result.returncode != 0 and "is a secret" in result.stderr, where


def test_workers_run_what_docker_compose_runs() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    for doc in workloads(render()):
        (container,) = pod_spec(doc)["containers"]
        assert container["command"] + container["args"] == compose[component(doc)]["command"], component(doc)


def test_every_compose_service_checks_what_the_charts_readiness_probe_checks() -> None:
    """docker-compose.yml: every long-running service has a healthcheck; a worker's and Beat's is the
    chart's readiness command, the gateway's its readiness path (the one-shot migrate has none: compose
    waits for it to exit). ``tests/test_cli.py`` validates the file with docker-compose itself."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    assert {name for name, service in compose.items() if "healthcheck" not in service} == {"migrate"}
    docs = {component(d): pod_spec(d)["containers"][0] for d in workloads(render())}
    for role in COMPONENTS - {"gateway"}:
        readiness = docs[role]["readinessProbe"]["exec"]["command"][:5]
        assert compose[role]["healthcheck"]["test"] == ["CMD", *readiness], role
    path = docs["gateway"]["readinessProbe"]["httpGet"]["path"]
    assert f"127.0.0.1:8080{path}'" in " ".join(compose["gateway"]["healthcheck"]["test"])


def test_probes_are_engrams_own() -> None:
    docs = {component(d): pod_spec(d)["containers"][0] for d in workloads(render())}
    for role in COMPONENTS - {"gateway"}:
        assert docs[role]["livenessProbe"]["exec"]["command"][:5] == ["engram", "probe", "live", "--role", role]
        assert docs[role]["readinessProbe"]["exec"]["command"][:5] == ["engram", "probe", "ready", "--role", role]
    assert docs["gateway"]["livenessProbe"]["httpGet"]["path"] == "/v1/livez"
    assert docs["gateway"]["readinessProbe"]["httpGet"]["path"] == "/v1/readyz"


@pytest.mark.parametrize(("limit", "cpus"), [("2", "2"), ("1500m", "1.5"), ("4", "4")])
def test_the_apply_pool_is_sized_from_the_cpu_limit(limit: str, cpus: str) -> None:
    docs = render("--set-string", f"workers.apply.resources.limits.cpu={limit}")
    (apply,) = [d for d in workloads(docs) if component(d) == "apply"]
    env = {v["name"]: v.get("value") for v in pod_spec(apply)["containers"][0]["env"]}
    assert env["ENGRAM_CPU_LIMIT"] == cpus


def test_keda_scales_each_worker_on_queue_length_and_lag() -> None:
    docs = render("-f", str(PRODUCTION))
    scaled = {d["spec"]["scaleTargetRef"]["name"]: d for d in docs if d["kind"] == "ScaledObject"}
    assert set(scaled) == {f"engram-{kind}" for kind in ("extract", "apply", "maintenance")}
    for name, obj in scaled.items():
        queue = "engram." + name.removeprefix("engram-")
        redis_trigger, lag_trigger = obj["spec"]["triggers"]
        assert redis_trigger["type"] == "redis" and redis_trigger["metadata"]["listName"] == queue
        assert redis_trigger["authenticationRef"]["name"] == "engram-redis"
        assert lag_trigger["type"] == "prometheus"
        assert lag_trigger["metadata"]["query"] == f'max(engram_queue_lag_seconds{{queue="{queue}"}})'
    # KEDA owns the replica count of the workers it scales.
    for doc in workloads(docs):
        assert ("replicas" in doc["spec"]) == (component(doc) in {"beat", "gateway"})
    (auth,) = [d for d in docs if d["kind"] == "TriggerAuthentication"]
    assert auth["spec"]["secretTargetRef"][0] == {
        "parameter": "password",
        "name": "engram-secrets",
        "key": "REDIS_PASSWORD",
    }


def test_every_process_on_neo4j_runs_engram_migrate_first() -> None:
    """With Neo4j, each pod that opens it (workers, gateway; not Beat) runs `engram migrate` in an init
    container with the same secrets and hardening as its process; the embedded store needs none."""
    docs = workloads(render("-f", str(PRODUCTION)))
    for doc in docs:
        inits = pod_spec(doc).get("initContainers", [])
        if component(doc) == "beat":
            assert not inits
            continue
        (init,) = inits
        (main,) = pod_spec(doc)["containers"]
        assert init["command"] + init["args"] == ["engram", "migrate"], component(doc)
        assert init["image"] == main["image"] and init["securityContext"] == main["securityContext"]
        secrets = [{e["name"] for e in c["env"] if "valueFrom" in e} for c in (init, main)]
        assert secrets[0] == secrets[1] and "NEO4J_PASSWORD" in secrets[0], component(doc)
    assert not any(pod_spec(d).get("initContainers") for d in workloads(render()))
    off = render("-f", str(PRODUCTION), "--set", "migrate.initContainer=false")
    assert not any(pod_spec(d).get("initContainers") for d in workloads(off))


def test_migrate_can_run_as_a_hook_job_before_install_and_upgrade() -> None:
    """``migrate.job.enabled``: one pre-install/pre-upgrade hook Job runs `engram migrate` (hardened like
    every pod, its password by secretKeyRef from the existing Secret, optionally as a schema-admin user of
    its own), and the pods lose their init containers; without an existing Secret it refuses to render."""
    admin = ["--set", "migrate.job.user=schema-admin", "--set", "migrate.job.passwordKey=NEO4J_ADMIN_PASSWORD"]
    docs = render("-f", str(PRODUCTION), "--set", "migrate.job.enabled=true", *admin)
    (job,) = [d for d in docs if d["kind"] == "Job"]
    assert set(job["metadata"]["annotations"]["helm.sh/hook"].split(",")) == {"pre-install", "pre-upgrade"}
    spec = pod_spec(job)
    (container,) = spec["containers"]
    assert container["command"] + container["args"] == ["engram", "migrate"]
    assert spec["restartPolicy"] == "Never" and spec["automountServiceAccountToken"] is False
    (worker,) = pod_spec(next(d for d in docs if d["kind"] == "Deployment" and component(d) == "apply"))["containers"]
    assert container["securityContext"] == worker["securityContext"] and container["image"] == worker["image"]
    assert spec["securityContext"]["runAsNonRoot"] is True and "/tmp" in {
        m["mountPath"] for m in container["volumeMounts"]
    }
    assert {"cpu", "memory"} <= set(container["resources"]["limits"])
    env = {var["name"]: var for var in container["env"]}
    assert env["NEO4J_URI"]["value"] == "bolt://engram-neo4j:7687" and env["NEO4J_USER"]["value"] == "schema-admin"
    assert env["NEO4J_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "engram-secrets",
        "key": "NEO4J_ADMIN_PASSWORD",
    }
    assert not SECRET_NAMES - {"NEO4J_PASSWORD"} & set(env)
    assert not any(pod_spec(d).get("initContainers") for d in workloads(docs) if d is not job)
    lint = helm("lint", "--strict", str(CHART), "-f", str(PRODUCTION), "--set", "migrate.job.enabled=true", *admin)
    assert "0 chart(s) failed" in lint.stdout
    # Off (the default): no Job. With the chart-made Secret: refused, the hook would run before it exists.
    assert not [d for d in render("-f", str(PRODUCTION)) if d["kind"] == "Job"]
    made = helm("template", "engram", str(CHART), "--set", "neo4j.uri=bolt://neo4j:7687", "--set", "migrate.job.enabled=true", check=False)  # fmt: skip
    assert made.returncode != 0 and "migrate.job needs secrets.name" in made.stderr


def test_a_redis_ca_secret_is_mounted_in_every_pod_and_named_by_the_tls_setting() -> None:
    docs = render("--set", "redisTls.caSecret=redis-ca")
    (config,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-config")]
    assert config["data"]["ENGRAM_REDIS_TLS_CA_FILE"] == "/etc/engram/redis-ca/ca.crt"
    for doc in workloads(docs):
        spec = pod_spec(doc)
        if not any(v.get("persistentVolumeClaim") for v in spec["volumes"]):
            continue  # the migrate hook Job: Neo4j only
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["redis-ca"]["secret"]["secretName"] == "redis-ca", component(doc)
        for container in spec["containers"]:
            mounts = {m["name"]: m for m in container["volumeMounts"]}
            assert mounts["redis-ca"] == {"name": "redis-ca", "mountPath": "/etc/engram/redis-ca", "readOnly": True}
    assert (
        "ENGRAM_REDIS_TLS_CA_FILE"
        not in next(d for d in render() if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-config"))[
            "data"
        ]
    )  # without a CA Secret: the system's CAs
