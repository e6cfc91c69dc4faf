"""deploy/redis and deploy/kubernetes-redis: several replicas on one update log in Redis.

Every object here is also checked against the Kubernetes schemas with the rest of deploy/
(test_manifests.py). These tests check what docs/kubernetes.md promises on top: the durable
Redis settings, who can reach Redis, where the password and the keys come from, the read-only
graph, and that only the Redis-log variant runs several live replicas. The shipped redis.conf
and the StatefulSet's start script and probes are run against the real redis-server: skipped
where it is not installed, failed instead when the environment variable CI is set (CI installs
it).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import stat
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.servers.ports import free_ports
from tests.unit.deploy.kustomize import load_docs, only, render

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "kubernetes"
REDIS = DEPLOY / "redis"
REDIS_LOG = DEPLOY / "kubernetes-redis"
REDIS_CONF = REDIS / "redis.conf"
KUBERNETES_DOC = ROOT / "docs" / "kubernetes.md"
# Every directory that `kubectl apply -k` takes and that holds a gnnserve Deployment.
SERVER_VARIANTS = (K8S, DEPLOY / "kubernetes-gateway-auth", REDIS_LOG)
SERVER_LABELS = {"app.kubernetes.io/name": "gnnserve", "app.kubernetes.io/component": "torchserve"}


# --- helpers -------------------------------------------------------------------------------


def read_redis_conf(path: Path = REDIS_CONF) -> list[tuple[str, list[str]]]:
    """(directive, arguments) per line, as redis-server splits them (quotes allowed)."""
    lines = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, *args = shlex.split(line)
            lines.append((name.lower(), args))
    return lines


def redis_conf() -> dict[str, list[str]]:
    return dict(read_redis_conf())


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def pod_labels(workload: dict[str, Any]) -> dict[str, str]:
    return workload["spec"]["template"]["metadata"]["labels"]


def single_container(workload: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod_spec(workload)["containers"]
    return container


def statefulset() -> dict[str, Any]:
    return only(render(REDIS), "StatefulSet")


def redis_container() -> dict[str, Any]:
    return single_container(statefulset())


def live_deployment() -> dict[str, Any]:
    return only(render(REDIS_LOG), "Deployment")


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in container.get("env", [])}


def volume(workload: dict[str, Any], name: str) -> dict[str, Any]:
    """A pod volume by name; a StatefulSet's claim template as {"name", "volumeClaimTemplate"}."""
    found = [v for v in pod_spec(workload).get("volumes", []) if v["name"] == name]
    found += [
        {"name": name, "volumeClaimTemplate": claim}
        for claim in workload["spec"].get("volumeClaimTemplates", [])
        if claim["metadata"]["name"] == name
    ]
    assert len(found) == 1, f"volume {name}: {found}"
    return found[0]


def mount_at(workload: dict[str, Any], path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The (volumeMount, volume) of the single container that holds `path`."""
    mounts = [
        mount
        for mount in single_container(workload)["volumeMounts"]
        if path == mount["mountPath"] or path.startswith(mount["mountPath"].rstrip("/") + "/")
    ]
    assert mounts, f"{path} is on no volume"
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    return mount, volume(workload, mount["name"])


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a matchLabels selector (the only form deploy/ uses) selects these labels."""
    assert set(selector) == {"matchLabels"}, selector
    return selector["matchLabels"].items() <= labels.items()


def script_of(command: list[str]) -> str:
    assert command[:2] == ["/bin/sh", "-c"], command
    return command[2]


def quantity_bytes(text: str) -> int:
    """A Kubernetes memory quantity (Gi, Mi) or a Redis one (mb, gb) in bytes."""
    match = re.fullmatch(r"(\d+)(Gi|Mi|Ki|gb|mb|kb)", text)
    assert match, text
    factor = {"Gi": 1 << 30, "Mi": 1 << 20, "Ki": 1 << 10, "gb": 1 << 30, "mb": 1 << 20}
    return int(match.group(1)) * factor.get(match.group(2), 1 << 10)


def redis_flag(script: str, flag: str) -> str:
    match = re.search(rf"{flag} (\S+)", script)
    assert match, f"{flag} is not on the redis-server command line"
    return match.group(1)


# --- redis.conf ----------------------------------------------------------------------------


def test_the_shipped_redis_conf_acknowledges_only_what_is_on_disk():
    names = [name for name, _ in read_redis_conf()]
    assert len(names) == len(set(names)), "a directive given twice: the last one silently wins"
    conf = redis_conf()
    assert conf["appendonly"] == ["yes"]
    # fsync before the answer: an acknowledged update is on the disk.
    assert conf["appendfsync"] == ["always"]
    # ... also while a rewrite runs (yes would skip those fsyncs).
    assert conf["no-appendfsync-on-rewrite"] == ["no"]
    assert conf["aof-use-rdb-preamble"] == ["yes"]
    # A torn tail is a write that was never answered; damage elsewhere stops Redis.
    assert conf["aof-load-truncated"] == ["yes"]
    # RDB snapshots are off on purpose (the AOF is what Redis loads), and said so.
    assert conf["save"] == [""]
    assert conf["stop-writes-on-bgsave-error"] == ["yes"]
    # The log is data: never evicted, writes refused when memory is full.
    assert conf["maxmemory-policy"] == ["noeviction"]
    assert "dir" in conf


def test_the_shipped_redis_conf_holds_no_secret_and_refuses_an_open_network():
    conf = redis_conf()
    for secret in ("requirepass", "masterauth", "user", "aclfile"):
        assert secret not in conf, f"{secret} belongs in the Secret, not in the ConfigMap"
    # Without a password Redis refuses every non-loopback client.
    assert conf["protected-mode"] == ["yes"]
    assert conf["daemonize"] == ["no"]
    for command in ("enable-debug-command", "enable-module-command", "enable-protected-configs"):
        assert conf[command] == ["no"], command


def test_every_setting_of_redis_conf_says_why():
    """Each paragraph that sets something starts with the comment that explains it."""
    for paragraph in re.split(r"\n\s*\n", REDIS_CONF.read_text()):
        lines = [line.strip() for line in paragraph.strip().splitlines()]
        if any(line and not line.startswith("#") for line in lines):
            assert lines[0].startswith("#"), f"no comment explains:\n{paragraph}"


# --- the real redis-server -----------------------------------------------------------------


def require_redis_binaries() -> None:
    missing = [name for name in ("redis-server", "redis-cli") if shutil.which(name) is None]
    if not missing:
        return
    message = f"{' and '.join(missing)} not installed (Debian: apt-get install redis-server)"
    if os.environ.get("CI"):
        pytest.fail(f"{message}; CI installs it, so this is a broken CI image")
    pytest.skip(message)


def cli(port: int, *args: str, password: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "REDISCLI_AUTH"}
    if password is not None:
        env["REDISCLI_AUTH"] = password
    done = subprocess.run(
        ["redis-cli", "-h", "127.0.0.1", "-p", str(port), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=10,
        check=False,
    )
    return (done.stdout + done.stderr).strip()


def config_get(port: int, name: str, password: str | None = None) -> str:
    answer = cli(port, "CONFIG", "GET", name, password=password).splitlines()
    assert answer[:1] == [name], answer
    return answer[1] if len(answer) > 1 else ""


@contextmanager
def running(command: list[str], port: int, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Starts a redis-server (directly, or a script that execs it) and stops it by its PID."""
    with log.open("wb") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 15
        while True:
            if process.poll() is not None:
                pytest.fail(f"redis-server exited with {process.returncode}:\n{log.read_text()}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"redis-server did not listen on {port}:\n{log.read_text()}")
                time.sleep(0.05)
        yield process
    finally:
        if process.poll() is None:
            process.terminate()  # SIGTERM to this PID only: Redis fsyncs and exits
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


def test_the_real_redis_server_loads_the_shipped_config_and_keeps_entries(tmp_path):
    require_redis_binaries()
    port = free_ports(1)[0]
    command = [
        "redis-server",
        str(REDIS_CONF),
        *("--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path)),
        *("--daemonize", "no"),
    ]
    with running(command, port, tmp_path / "first.log") as server:
        assert cli(port, "PING") == "PONG"
        expected = {
            "appendonly": "yes",
            "appendfsync": "always",
            "maxmemory-policy": "noeviction",
            "aof-use-rdb-preamble": "yes",
            "no-appendfsync-on-rewrite": "no",
            "save": "",
            "protected-mode": "yes",
            "dir": str(tmp_path.resolve()),
        }
        for name, value in expected.items():
            assert config_get(port, name) == value, name
        # The protected configs cannot be moved from a client connection.
        assert "protected config" in cli(port, "CONFIG", "SET", "dir", "/")
        assert cli(port, "XADD", "gnnserve:updates:test", "1-0", "operations", "[]") == "1-0"
        assert (tmp_path / "appendonlydir").is_dir()
        server.kill()  # a crash, not a shutdown
        server.wait(timeout=10)
    with running(command, port, tmp_path / "second.log"):
        entries = cli(port, "XRANGE", "gnnserve:updates:test", "-", "+")
        assert entries.splitlines()[:3] == ["1-0", "operations", "[]"], entries


def pod_script(text: str, tmp: Path, port: int) -> str:
    """The StatefulSet's shell text with the pod's paths and port moved into `tmp`."""
    replacements = {
        "/etc/redis/redis.conf": str(REDIS_CONF),
        "/etc/redis-secret": str(tmp / "secret"),
        "/run/redis": str(tmp / "run"),
        "--dir /data": f"--dir {tmp / 'data'} --port {port} --bind 127.0.0.1",
        "-p 6379": f"-p {port}",
    }
    for old, new in replacements.items():
        text = text.replace(old, new)
    return text


def probe_passes(probe: dict[str, Any], tmp: Path, port: int) -> bool:
    command = probe["exec"]["command"]
    done = subprocess.run(
        ["/bin/sh", "-c", pod_script(script_of(command), tmp, port)],
        capture_output=True,
        timeout=10,
        check=False,
    )
    return done.returncode == 0


def pod_dirs(tmp: Path, password: str) -> None:
    for name in ("secret", "run", "data"):
        (tmp / name).mkdir(exist_ok=True)
    (tmp / "secret" / "password").write_text(password)


def test_the_pod_starts_redis_with_the_secret_password_and_its_probes_pass(tmp_path):
    require_redis_binaries()
    container = redis_container()
    start = script_of(container["command"])
    for path in ("/etc/redis/redis.conf", "/etc/redis-secret/password", "/run/redis", "/data"):
        assert path in start, f"the start script no longer uses {path}: update this test"
    password = os.urandom(16).hex()
    pod_dirs(tmp_path, password)
    port = free_ports(1)[0]
    command = ["/bin/sh", "-c", pod_script(start, tmp_path, port)]
    with running(command, port, tmp_path / "redis.log") as server:
        assert "NOAUTH" in cli(port, "PING")
        assert cli(port, "PING", password=password) == "PONG"
        assert config_get(port, "requirepass", password) == password
        assert config_get(port, "appendfsync", password) == "always"
        maxmemory = int(config_get(port, "maxmemory", password))
        assert maxmemory == quantity_bytes(redis_flag(start, "--maxmemory"))
        auth = tmp_path / "run" / "auth.conf"
        assert stat.S_IMODE(auth.stat().st_mode) == 0o600
        cmdline = Path(f"/proc/{server.pid}/cmdline")
        if cmdline.exists():  # Linux: the password is in no process's command line
            assert password not in cmdline.read_bytes().decode(errors="replace")
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert probe_passes(container[probe], tmp_path, port), probe
        # With another password in the file, every probe fails.
        (tmp_path / "secret" / "password").write_text("0" * 32)
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert not probe_passes(container[probe], tmp_path, port), probe


@pytest.mark.parametrize("password", ['abc"def0123456789', "short", "with space 0123456789"])
def test_the_pod_refuses_a_password_it_cannot_write_safely(tmp_path, password):
    require_redis_binaries()
    pod_dirs(tmp_path, password)
    start = pod_script(script_of(redis_container()["command"]), tmp_path, free_ports(1)[0])
    done = subprocess.run(
        ["/bin/sh", "-c", start], capture_output=True, text=True, timeout=10, check=False
    )
    assert done.returncode == 1, done
    assert "gnnserve-redis: the password" in done.stderr
    assert not (tmp_path / "run" / "auth.conf").exists()


# --- the Redis StatefulSet -----------------------------------------------------------------


def test_the_statefulset_runs_one_primary_on_its_own_volume_with_the_shipped_config():
    objects = render(REDIS)
    sts, service = statefulset(), only(objects, "Service")
    spec = sts["spec"]
    # Pod 1 of this StatefulSet would be a second, empty primary, not a replica.
    assert spec["replicas"] == 1
    assert re.fullmatch(r"redis:7\.\d+\.\d+", redis_container()["image"])
    # Headless, and the StatefulSet's governing Service: stable DNS for pod 0.
    assert spec["serviceName"] == service["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"].items() <= pod_labels(sts).items()
    assert spec["selector"]["matchLabels"].items() <= pod_labels(sts).items()
    start = script_of(redis_container()["command"])
    # The AOF lives on the claim template's volume; deleting the set keeps it.
    (claim,) = spec["volumeClaimTemplates"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    data_dir = redis_flag(start, "--dir")
    mount, data = mount_at(sts, data_dir)
    assert data["volumeClaimTemplate"] is claim and mount["mountPath"] == data_dir
    assert redis_container()["workingDir"] == data_dir
    assert spec["persistentVolumeClaimRetentionPolicy"] == {
        "whenDeleted": "Retain",
        "whenScaled": "Retain",
    }
    # The config is deploy/redis/redis.conf, through the generated ConfigMap.
    conf_path = re.search(r"redis-server (\S+)", start).group(1)
    mount, config = mount_at(sts, conf_path)
    assert mount.get("readOnly") is True
    config_map = only(objects, "ConfigMap", config["configMap"]["name"])
    assert config_map["data"][Path(conf_path).name] == REDIS_CONF.read_text()
    # A container port, and the same port in redis.conf and in the Service.
    (port,) = redis_container()["ports"]
    assert [p["port"] for p in service["spec"]["ports"]] == [port["containerPort"]]
    assert redis_conf()["port"] == [str(port["containerPort"])]


def test_redis_runs_non_root_read_only_and_refuses_writes_before_its_memory_limit():
    sts, container = statefulset(), redis_container()
    pod = pod_spec(sts)
    assert pod["automountServiceAccountToken"] is False
    security = pod["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] != 0
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    own = container["securityContext"]
    assert own["readOnlyRootFilesystem"] is True
    assert own["allowPrivilegeEscalation"] is False
    assert own["capabilities"] == {"drop": ["ALL"]}
    for bound in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(container["resources"][bound])
    limit = quantity_bytes(container["resources"]["limits"]["memory"])
    maxmemory = quantity_bytes(redis_flag(script_of(container["command"]), "--maxmemory"))
    # Redis refuses writes (noeviction) long before the kernel kills it; an AOF rewrite forks.
    assert maxmemory <= limit // 2
    # What Redis and its start script write: the claim's volume and an in-memory emptyDir.
    claims = {claim["metadata"]["name"] for claim in sts["spec"]["volumeClaimTemplates"]}
    for mount in container["volumeMounts"]:
        if not mount.get("readOnly") and mount["name"] not in claims:
            assert volume(sts, mount["name"])["emptyDir"]["medium"] == "Memory"


def test_the_redis_password_comes_from_the_secret_and_never_from_a_command_line():
    sts, container = statefulset(), redis_container()
    start = script_of(container["command"])
    assert "--requirepass" not in start
    secret_path = re.search(r"cat (\S+/password)", start).group(1)
    mount, secret_volume = mount_at(sts, secret_path)
    secret = secret_volume["secret"]
    assert secret["items"] == [{"key": "password", "path": Path(secret_path).name}]
    assert secret["defaultMode"] & 0o077 == 0  # the kubelet adds group read for fsGroup
    assert mount.get("readOnly") is True
    # The gnnserve pods read their password from the same Secret.
    url = env_of(single_container(live_deployment()))["GNNSERVE_UPDATE_LOG_URL"]
    assert url["valueFrom"]["secretKeyRef"]["name"] == secret["secretName"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        text = script_of(container[probe]["exec"]["command"])
        assert f'REDISCLI_AUTH="$(cat {secret_path})"' in text, probe
        assert " -a " not in text and "--pass" not in text and "--user" not in text, probe
    assert not container.get("env"), "no secret or setting travels in the environment"


# --- who reaches Redis ---------------------------------------------------------------------


def test_only_gnnserve_server_pods_reach_redis_and_redis_reaches_nobody():
    sts = statefulset()
    policy = only(render(REDIS), "NetworkPolicy")
    assert selects(policy["spec"]["podSelector"], pod_labels(sts))
    assert sorted(policy["spec"]["policyTypes"]) == ["Egress", "Ingress"]
    assert not policy["spec"].get("egress"), "Redis needs no connection of its own"
    (rule,) = policy["spec"]["ingress"]
    (port,) = redis_container()["ports"]
    assert rule["ports"] == [{"port": port["containerPort"], "protocol": "TCP"}]
    (peer,) = rule["from"]
    # A pod selector alone: pods of this namespace, no namespaceSelector, no ipBlock.
    assert set(peer) == {"podSelector"}
    allowed = peer["podSelector"]
    assert selects(allowed, pod_labels(live_deployment()))
    loader = load_docs(K8S / "model-store-loader.yaml")[0]
    outsiders = {
        "the model-store loader": loader["metadata"]["labels"],
        "a gateway client": {"gnnserve/client": "true", "app.kubernetes.io/name": "gateway"},
        "Redis itself": pod_labels(sts),
    }
    for who, labels in outsiders.items():
        assert not selects(allowed, labels), who


def selector_labels(doc: dict[str, Any]) -> dict[str, str] | None:
    """The labels a Service, workload, PodDisruptionBudget or NetworkPolicy selects pods by."""
    spec = doc.get("spec", {})
    if doc["kind"] == "Service":
        return spec["selector"]
    selector = spec.get("podSelector") if doc["kind"] == "NetworkPolicy" else spec.get("selector")
    return selector["matchLabels"] if selector else None


def test_the_server_and_redis_selectors_never_pick_each_others_pods():
    redis_pods, server_pods = pod_labels(statefulset()), pod_labels(live_deployment())
    for doc in render(REDIS_LOG):
        labels = selector_labels(doc)
        if labels is not None:
            assert not labels.items() <= redis_pods.items(), doc["metadata"]["name"]
    for doc in render(REDIS):
        labels = selector_labels(doc)
        if labels is not None:
            assert not labels.items() <= server_pods.items(), doc["metadata"]["name"]


# --- the gnnserve replicas -----------------------------------------------------------------


def test_the_replicas_read_the_redis_url_and_both_keys_from_secrets():
    deployment = live_deployment()
    env = env_of(single_container(deployment))
    for name in ("GNNSERVE_UPDATE_LOG_URL", "GNNSERVE_UPDATE_SECRET"):
        assert "value" not in env[name], f"{name} must come from a Secret, never a literal"
        assert set(env[name]["valueFrom"]) == {"secretKeyRef"}, name
    password_file = env["GNNSERVE_REDIS_PASSWORD_FILE"]["value"]
    mount, secret_volume = mount_at(deployment, password_file)
    assert mount.get("readOnly") is True
    secret = secret_volume["secret"]
    url_secret = env["GNNSERVE_UPDATE_LOG_URL"]["valueFrom"]["secretKeyRef"]
    assert secret["secretName"] == url_secret["name"]
    # The key the Redis pod reads its password from, under the whole-Secret mount.
    assert Path(password_file).name == "password" and "items" not in secret
    assert Path(password_file).parent == Path(mount["mountPath"])
    # The handler refuses a password file group can write or others can read (with fsGroup
    # the kubelet adds group read, which it allows).
    assert secret["defaultMode"] & (stat.S_IWGRP | stat.S_IRWXO) == 0
    assert env["GNNSERVE_REDIS_WAIT_REPLICAS"]["value"].isdigit()
    assert env["GNNSERVE_REDIS_WAIT_TIMEOUT_MS"]["value"].isdigit()
    assert env["GNNSERVE_UPDATE_SECRET"]["valueFrom"]["secretKeyRef"]["name"] != url_secret["name"]


def test_no_manifest_carries_a_redis_url_or_a_secret_as_a_literal():
    documents = [doc for directory in (K8S, REDIS, REDIS_LOG) for doc in render(directory)]
    text = yaml.safe_dump_all(documents)
    assert not re.search(r"rediss?://", text), "a Redis URL belongs in the Secret"
    for doc in documents:
        if doc["kind"] in ("Deployment", "StatefulSet"):
            for item in single_container(doc).get("env", []):
                if re.search(r"SECRET|PASSWORD|TOKEN|KEY", item["name"]):
                    assert "valueFrom" in item or item["name"].endswith("_FILE"), item


def test_the_graph_is_mounted_read_only_from_a_read_only_many_claim():
    deployment, objects = live_deployment(), render(REDIS_LOG)
    mount, graphs = mount_at(deployment, "/graphs/any-graph")
    assert mount["mountPath"] == "/graphs" and mount["readOnly"] is True
    assert graphs["persistentVolumeClaim"]["readOnly"] is True
    claim = only(objects, "PersistentVolumeClaim", graphs["persistentVolumeClaim"]["claimName"])
    assert claim["spec"]["accessModes"] == ["ReadOnlyMany"]
    # Every volume the overlay adds is read-only: the pods keep no update log of their own.
    base = only(render(K8S), "Deployment")
    base_mounts = {m["name"] for m in single_container(base)["volumeMounts"]}
    added = [
        m for m in single_container(deployment)["volumeMounts"] if m["name"] not in base_mounts
    ]
    assert added and all(m.get("readOnly") is True for m in added), added
    empty_dirs = {v["name"] for v in pod_spec(deployment)["volumes"] if "emptyDir" in v}
    assert empty_dirs == {v["name"] for v in pod_spec(base)["volumes"] if "emptyDir" in v}


def most_pods(objects: list[dict[str, Any]]) -> int:
    deployment = only(objects, "Deployment")
    hpas = [doc for doc in objects if doc["kind"] == "HorizontalPodAutoscaler"]
    if hpas:
        (hpa,) = hpas
        assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
        return hpa["spec"]["maxReplicas"]
    return deployment["spec"].get("replicas", 1)


@pytest.mark.parametrize("directory", SERVER_VARIANTS, ids=[d.name for d in SERVER_VARIANTS])
def test_several_live_replicas_only_on_the_shared_redis_log(directory):
    """A variant that passes the update key takes updates; with the file log each pod would
    keep its own, so more than one pod is allowed only with GNNSERVE_UPDATE_LOG_URL."""
    objects = render(directory)
    env = env_of(single_container(only(objects, "Deployment")))
    live, shared = "GNNSERVE_UPDATE_SECRET" in env, "GNNSERVE_UPDATE_LOG_URL" in env
    if live and not shared:
        assert most_pods(objects) == 1
    if directory == REDIS_LOG:
        assert live and shared
        hpa = only(objects, "HorizontalPodAutoscaler")
        assert hpa["spec"]["minReplicas"] >= 3
        assert "replicas" not in only(objects, "Deployment")["spec"]  # the HPA owns the count
    else:
        # Frozen graphs: an update-enabled archive refuses to start here (no update key).
        assert not live and not shared


def test_the_replicas_share_one_key_set_so_tokens_are_replaced_by_the_network_policy():
    """TorchServe draws each pod's tokens at random: several pods behind one Service need the
    gateway overlay's set-up (deploy/README.md, "Tokens and several pods")."""
    objects = render(REDIS_LOG)
    container = single_container(only(objects, "Deployment"))
    assert "--disable-token-auth" in container["command"]
    policy = only(objects, "NetworkPolicy")
    inference = [
        rule
        for rule in policy["spec"]["ingress"]
        if {"port": 8080, "protocol": "TCP"} in rule["ports"]
    ]
    assert [rule["from"] for rule in inference] == [
        [{"podSelector": {"matchLabels": {"gnnserve/client": "true"}}}]
    ]
    pdb = only(objects, "PodDisruptionBudget")
    assert selects(pdb["spec"]["selector"], pod_labels(only(objects, "Deployment")))
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pod_spec(only(objects, "Deployment"))["enableServiceLinks"] is False


def test_the_documented_url_names_the_redis_pod_and_its_port():
    sts = statefulset()
    (port,) = redis_container()["ports"]
    url = f"redis://{sts['metadata']['name']}-0.{sts['spec']['serviceName']}:{port['containerPort']}/0"
    assert url in KUBERNETES_DOC.read_text()
    assert url in (REDIS_LOG / "kustomization.yaml").read_text()
