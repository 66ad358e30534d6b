"""deploy/: the Kubernetes manifests validated against the Kubernetes schemas (offline), the compose file and its
HAProxy config checked, the Dockerfile's build context built into a wheel, the shipped configs loaded."""

from __future__ import annotations

import copy
import functools
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from conftest import ROOT

from toolkeeper.policy import load_rules
from toolkeeper.settings import read_config
from toolkeeper.tools import load_agent_file

DEPLOY = ROOT / "deploy"
KUBERNETES = DEPLOY / "kubernetes"


def manifests() -> list[Path]:
    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    return [KUBERNETES / name for name in kustomization["resources"]]


@pytest.mark.parametrize("path", manifests(), ids=lambda p: p.name)
def test_each_manifest_is_valid_for_kubernetes(path):
    for document in yaml.safe_load_all(path.read_text()):
        kubernetes_validate.validate(document, kubernetes_validate.latest_version(), strict=True)


def deployment() -> dict:
    return yaml.safe_load((KUBERNETES / "deployment.yaml").read_text())


@functools.cache
def rendered() -> tuple[dict, ...]:
    """deploy/kubernetes as `kubectl apply -k` sends it, rendered by kustomize itself (`kubectl kustomize`)."""
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is needed: scripts/test installs Debian's kubernetes-client"
    made = subprocess.run([kubectl, "kustomize", str(KUBERNETES)], capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    return tuple(document for document in yaml.safe_load_all(made.stdout) if document)


def test_what_apply_k_sends_is_valid_and_never_overwrites_the_secret():
    kinds = []
    for document in rendered():
        kubernetes_validate.validate(document, kubernetes_validate.latest_version(), strict=True)
        kinds.append(document["kind"])
        if document["kind"] != "Namespace":
            assert document["metadata"]["namespace"] == "toolkeeper", document["metadata"]["name"]
    assert "Secret" not in kinds  # made once by `kubectl create secret`: a re-apply must not replace it
    assert {"Deployment", "Service", "ConfigMap", "HorizontalPodAutoscaler", "PodDisruptionBudget"} <= set(kinds)
    pod = next(d for d in rendered() if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert {"secretName": "toolkeeper", "defaultMode": 0o440} in [v.get("secret") for v in pod["volumes"]]


def test_the_autoscaler_alone_owns_the_number_of_pods():
    autoscaler = next(d for d in rendered() if d["kind"] == "HorizontalPodAutoscaler")
    target = next(d for d in rendered() if d["kind"] == "Deployment")
    assert autoscaler["spec"]["scaleTargetRef"]["name"] == target["metadata"]["name"]
    assert "replicas" not in target["spec"]  # else every re-apply resets what the autoscaler chose
    assert autoscaler["spec"]["minReplicas"] >= 2


def unreadable_mounts(pod: dict) -> list[str]:
    """The files of the pod's Secret and ConfigMap volumes its container's user cannot read. The kubelet writes
    them owned by root, in the group `fsGroup` (root's without one), with the volume's mode (default 0644)."""
    container = pod["containers"][0]
    context = {**pod.get("securityContext", {}), **container.get("securityContext", {})}
    user = context.get("runAsUser", 0)
    groups = {context.get("runAsGroup", 0), *context.get("supplementalGroups", ())}
    file_group = pod.get("securityContext", {}).get("fsGroup", 0)
    if "fsGroup" in pod.get("securityContext", {}):
        groups.add(file_group)
    mounted = {mount["name"] for mount in container["volumeMounts"]}
    unreadable = []
    for volume in pod["volumes"]:
        source = volume.get("secret") or volume.get("configMap")
        if volume["name"] not in mounted or source is None:
            continue
        mode = source.get("defaultMode", 0o644)
        readable = user == 0 or mode & 0o004 or (mode & 0o040 and file_group in groups)
        if not readable:
            unreadable.append(volume["name"])
    return unreadable


def test_the_pods_user_reads_every_file_mounted_into_it_and_no_one_else_reads_the_secret():
    pod = next(d for d in rendered() if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert unreadable_mounts(pod) == []
    secret = next(v["secret"] for v in pod["volumes"] if "secret" in v)
    assert secret["defaultMode"] & 0o007 == 0  # not the world's
    # the check itself: the manifests' earlier 0400 without fsGroup, owned by root, is unreadable by uid 10001
    before = copy.deepcopy(pod)
    del before["securityContext"]["fsGroup"]
    next(v for v in before["volumes"] if "secret" in v)["secret"]["defaultMode"] = 0o400
    assert unreadable_mounts(before) == ["secrets"]


def test_the_deployment_probes_limits_and_runs_unprivileged_on_a_read_only_root():
    pod = deployment()["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"  # a database outage never restarts pods
    assert container["resources"]["requests"] and container["resources"]["limits"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    mounted = {mount["mountPath"] for mount in container["volumeMounts"]}
    assert {"/etc/toolkeeper", "/tmp"} <= mounted


def test_the_opa_sidecar_patch_makes_a_valid_deployment():
    patched = copy.deepcopy(deployment())
    patch = yaml.safe_load((KUBERNETES / "opa-sidecar.yaml").read_text())["spec"]["template"]["spec"]
    spec = patched["spec"]["template"]["spec"]
    mine = {c["name"]: c for c in spec["containers"]}
    for container in patch["containers"]:  # a strategic merge: containers by name, env appended
        if container["name"] in mine:
            mine[container["name"]]["env"] += container["env"]
        else:
            spec["containers"].append(container)
    spec["volumes"] += patch["volumes"]
    kubernetes_validate.validate(patched, kubernetes_validate.latest_version(), strict=True)
    assert [c["name"] for c in spec["containers"]] == ["toolkeeper", "opa"]


def test_the_configmap_holds_an_agent_file_rules_and_options_toolkeeper_loads(tmp_path):
    data = yaml.safe_load((KUBERNETES / "configmap.yaml").read_text())["data"]
    for name, text in data.items():
        (tmp_path / name).write_text(text)
    agent = load_agent_file(tmp_path / "agent.yaml")
    assert agent.tools
    assert load_rules(tmp_path / "rules.yaml").rules
    assert read_config(str(tmp_path / "toolkeeper.yaml"))["consent"] == "approvals"


def test_the_compose_file_runs_two_replicas_postgresql_opa_and_a_balancer():
    compose = yaml.safe_load((DEPLOY / "compose" / "compose.yaml").read_text())
    services = compose["services"]
    assert {"toolkeeper-a", "toolkeeper-b", "postgres", "opa", "balancer"} <= set(services)
    for name in ("toolkeeper-a", "toolkeeper-b"):
        assert services[name]["read_only"] is True and services[name]["build"]["dockerfile"] == "deploy/Dockerfile"
    assert read_config(str(DEPLOY / "compose" / "toolkeeper.yaml"))["opa_url"] == "http://opa:8181"
    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    checked = subprocess.run([haproxy, "-c", "-f", str(DEPLOY / "compose" / "haproxy.cfg")], capture_output=True,
                             text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr
    config = (DEPLOY / "compose" / "haproxy.cfg").read_text()
    assert "server a toolkeeper-a:8787" in config and "server b toolkeeper-b:8787" in config


def binds(service: dict) -> list[tuple[Path, str, bool]]:
    """A compose service's bind mounts: the host path (from deploy/compose), the container path, read-only."""
    found = []
    for volume in service.get("volumes", []):
        parts = volume.split(":")
        if parts[0].startswith((".", "/")):
            found.append(((DEPLOY / "compose" / parts[0]).resolve(), parts[1], "ro" in parts[2:]))
    return found


def on_host(mounts: list[tuple[Path, str, bool]], inside: str) -> Path | None:
    """The host file a container path shows, through the deepest mount holding it."""
    holding = [(source, target) for source, target, _ in mounts if inside == target or inside.startswith(target + "/")]
    if not holding:
        return None
    source, target = max(holding, key=lambda pair: len(pair[1]))
    return source / inside[len(target):].lstrip("/") if inside != target else source


def test_every_compose_mount_exists_none_needs_room_in_a_read_only_one_and_the_config_finds_the_agent():
    compose = yaml.safe_load((DEPLOY / "compose" / "compose.yaml").read_text())
    for name, service in compose["services"].items():
        mounts = binds(service)
        for source, target, _ in mounts:
            assert source.exists(), f"{name}: {source} is mounted but is not in the repository"
            for outer, outer_target, read_only in mounts:
                nested = target.startswith(outer_target.rstrip("/") + "/")
                relative = target[len(outer_target):].lstrip("/")
                # docker makes the mountpoint inside the outer mount: a read-only one must already hold it
                assert not (nested and read_only and not (outer / relative).exists()), f"{name}: {target}"
    toolkeeper = compose["services"]["toolkeeper-a"]
    config_path = toolkeeper["command"][toolkeeper["command"].index("--config") + 1]
    config_file = on_host(binds(toolkeeper), config_path)
    assert config_file is not None and config_file.is_file()
    agent_file = on_host(binds(toolkeeper), read_config(str(config_file))["agent_file"])
    assert agent_file is not None and load_agent_file(agent_file).tools


def test_the_dockerfile_builds_a_wheel_from_what_it_copies_and_runs_as_a_user(tmp_path):
    """No Docker engine here: the builder stage's COPY lines are replayed into a fresh context and built."""
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    builder = dockerfile.split("\nFROM ", 2)[1]
    context = tmp_path / "context"
    context.mkdir()
    for sources in re.findall(r"^COPY (?!--from)(.+) \S+$", builder, flags=re.M):
        for source in sources.split():
            target = context / source
            if (ROOT / source).is_dir():
                shutil.copytree(ROOT / source, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy(ROOT / source, target)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "wheels"),
                            str(context)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr
    wheel = next((tmp_path / "wheels").glob("toolkeeper-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "toolkeeper/_policies/default.yaml" in names and "toolkeeper/_example/agent.yaml" in names
    user = re.findall(r"^USER (\S+)", dockerfile, flags=re.M)
    assert user and user[-1] not in ("root", "0")


def test_the_grafana_dashboard_reads_only_metrics_toolkeeper_exports():
    import json

    from toolkeeper import metrics

    dashboard = json.loads((DEPLOY / "grafana" / "toolkeeper.json").read_text())
    exported = set(re.findall(r"^\s+(toolkeeper_\w+)", metrics.__doc__, flags=re.M))
    read = set()
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            read |= {re.sub(r"_(bucket|sum|count)$", "", name) for name in re.findall(r"toolkeeper_\w+", target["expr"])}
    assert read <= exported, read - exported
    assert {"toolkeeper_approvals_waiting", "toolkeeper_approval_wait_seconds", "toolkeeper_audit_write_failures_total",
            "toolkeeper_upstream_errors_total"} <= read
