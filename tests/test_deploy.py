"""deploy/: the Kubernetes manifests validated against the Kubernetes schemas (offline), the compose file and its
HAProxy config checked, the Dockerfile's build context built into a wheel, the shipped configs loaded."""

from __future__ import annotations

import copy
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
