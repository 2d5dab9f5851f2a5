"""Injection patches for every pod shape the contract names (applied and checked)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from sandman.contract import (
    ANN_CONTAINER,
    ANN_EXPIRES_AT,
    ANN_INJECTED,
    ANN_TOKEN_SHA256,
    ANN_TTL,
    LABEL_ID,
    LABEL_SANDBOX,
)
from sandman.webhook.mutate import (
    INIT_CONTAINER,
    VOLUME,
    InjectionSettings,
    MutationError,
    mutate,
)
from sandman.webhook.policy import Profile, RuleSet
from tests.unit.webhook.jsonpatch import apply

NOW = dt.datetime(2026, 11, 30, 12, 0, 0, tzinfo=dt.UTC)
SETTINGS = InjectionSettings(daemon_image="127.0.0.1:5000/sandman/daemon:t", version="9.9")
RULE = RuleSet(name="r")


def pod(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "sb-", "labels": {LABEL_SANDBOX: "true"}},
        "spec": {"containers": [{"name": "main", "image": "127.0.0.1:5000/x:1"}], **spec},
    }


def injected(
    p: dict[str, Any], rule: RuleSet = RULE, settings: InjectionSettings = SETTINGS
) -> tuple[dict[str, Any], Any]:
    m = mutate(
        p,
        rule=rule,
        settings=settings,
        now=NOW,
        new_id=lambda: "abc123",
        token_hash_for=lambda sid: "h" * 64 if sid == "abc123" else "x",
    )
    return apply(p, m.patch), m


def test_basic_injection_follows_the_contract() -> None:
    out, m = injected(pod())
    md, spec = out["metadata"], out["spec"]
    assert md["labels"][LABEL_ID] == "abc123" and m.sandbox_id == "abc123"
    # Default TTL 2h (RuleSet default): expires-at = 12:00 + 2h.
    assert md["annotations"][ANN_EXPIRES_AT] == "2026-11-30T14:00:00Z"
    assert md["annotations"][ANN_INJECTED] == "9.9"
    assert md["annotations"][ANN_TTL] == "2h"
    assert spec["schedulerName"] == "sandman-scheduler"
    assert spec["activeDeadlineSeconds"] == 24 * 3600  # max TTL 24h
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    assert spec["volumes"] == [{"name": VOLUME, "emptyDir": {}}]
    init = spec["initContainers"][0]
    assert init["name"] == INIT_CONTAINER and init["image"] == SETTINGS.daemon_image
    rt = "/.sandman/rt/bin/sandmand"
    daemon = [rt, "-I", "-S", "-m", "sandman.daemon"]
    assert init["command"] == [*daemon, "install", "/sandman-target"]
    assert init["volumeMounts"] == [{"name": VOLUME, "mountPath": "/sandman-target"}]
    c = spec["containers"][0]
    assert c["command"] == [*daemon, "serve", "--listen=0.0.0.0:7878", "--"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env == {"SANDMAN_TOKEN_SHA256": "h" * 64}  # TMPDIR is the image's business
    assert {"name": VOLUME, "mountPath": "/.sandman"} in c["volumeMounts"]
    assert c["ports"] == [{"name": "sandman", "containerPort": 7878, "protocol": "TCP"}]
    assert c["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": 7878}
    # No image lookups here (images=None): what runs instead is said.
    assert any("ENTRYPOINT/CMD do not run; only the daemon runs" in w for w in m.warnings)


def test_no_annotations_or_labels_maps() -> None:
    p = pod()
    p["metadata"] = {"name": "x", "labels": {LABEL_SANDBOX: "true"}}
    out, _ = injected(p)
    assert out["metadata"]["annotations"][ANN_INJECTED] == "9.9"
    p2 = pod()
    del p2["metadata"]["labels"]  # not a sandbox by label, but mutate itself must cope
    out2, _ = injected(p2)
    assert out2["metadata"]["labels"] == {LABEL_ID: "abc123"}


def test_command_and_args_are_kept_after_the_separator() -> None:
    c = {"name": "main", "image": "i", "command": ["python3", "-m", "srv"], "args": ["--port", "1"]}
    out, _ = injected(pod(containers=[c]))
    got = out["spec"]["containers"][0]
    assert got["command"][got["command"].index("--") + 1 :] == [
        "python3",
        "-m",
        "srv",
        "--port",
        "1",
    ]
    assert "args" not in got


def test_args_only_run_as_the_command_with_a_warning() -> None:
    out, m = injected(pod(containers=[{"name": "main", "image": "i", "args": ["sleep", "9"]}]))
    cmd = out["spec"]["containers"][0]["command"]
    assert cmd[cmd.index("--") + 1 :] == ["sleep", "9"]
    assert any("its args run as the command under the daemon" in w for w in m.warnings)


def test_existing_init_containers_sidecars_and_several_containers() -> None:
    p = pod(
        initContainers=[
            {"name": "setup", "image": "i"},
            {"name": "proxy", "image": "i", "restartPolicy": "Always"},
        ],
        containers=[
            {"name": "sidecar", "image": "s"},
            {"name": "agent", "image": "a", "command": ["run"]},
        ],
    )
    p["metadata"]["annotations"] = {ANN_CONTAINER: "agent"}
    out, _ = injected(p)
    names = [c["name"] for c in out["spec"]["initContainers"]]
    assert names == [INIT_CONTAINER, "setup", "proxy"]
    sidecar, agent = out["spec"]["containers"]
    assert "command" not in sidecar and "env" not in sidecar
    assert agent["command"][-1] == "run"


def test_unknown_target_container_is_denied() -> None:
    p = pod()
    p["metadata"]["annotations"] = {ANN_CONTAINER: "nope"}
    with pytest.raises(MutationError, match="names no container"):
        injected(p)


def test_existing_probes_env_mounts_and_security_context_survive() -> None:
    c = {
        "name": "main",
        "image": "i",
        "command": ["x"],
        "env": [
            {"name": "A", "value": "1"},
            {"name": "TMPDIR", "value": "/scratch"},
            {"name": "SANDMAN_TOKEN_SHA256", "value": "f" * 64},
        ],
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        "readinessProbe": {"exec": {"command": ["true"]}},
        "livenessProbe": {"exec": {"command": ["true"]}},
        "securityContext": {"runAsUser": 1000},
        "ports": [{"containerPort": 80}],
    }
    out, m = injected(pod(containers=[c], volumes=[{"name": "data", "emptyDir": {}}]))
    got = out["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in got["env"]}
    # A user-set token hash env must not win over the webhook's.
    assert env == {"A": "1", "TMPDIR": "/scratch", "SANDMAN_TOKEN_SHA256": "h" * 64}
    assert got["volumeMounts"][0] == {"name": "data", "mountPath": "/data"}
    assert got["livenessProbe"] == c["livenessProbe"]
    assert got["securityContext"]["runAsUser"] == 1000
    assert "NET_RAW" in got["securityContext"]["capabilities"]["drop"]
    assert [p["containerPort"] for p in got["ports"]] == [80, 7878]
    # The original readiness probe is kept: the daemon runs it behind /readyz.
    assert got["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert '--readiness-probe={"exec":{"command":["true"]}}' in got["command"]
    assert m.warnings == []
    assert [v["name"] for v in out["spec"]["volumes"]] == ["data", VOLUME]


def test_an_injected_pod_is_stripped_and_injected_anew() -> None:
    # Issue 15 item 7: a pod copied from a sandbox (or forged with the marker)
    # used to skip injection and keep its id, lease and token hash.
    c = {
        "name": "main",
        "image": "i",
        "command": ["python3", "-m", "agent"],
        "env": [{"name": "TMPDIR", "value": "/scratch"}],
        "readinessProbe": {"exec": {"command": ["true"]}, "periodSeconds": 7},
    }
    original = pod(containers=[c])
    first, _ = injected(original)
    m = mutate(
        first,
        rule=RULE,
        settings=SETTINGS,
        now=NOW,
        new_id=lambda: "other",
        token_hash_for=lambda s: "x" * 64,
    )
    again = apply(first, m.patch)
    fresh = apply(
        original,
        mutate(
            original,
            rule=RULE,
            settings=SETTINGS,
            now=NOW,
            new_id=lambda: "other",
            token_hash_for=lambda s: "x" * 64,
        ).patch,
    )
    assert again == fresh  # the same as injecting the original: nothing doubled or kept
    assert again["metadata"]["labels"][LABEL_ID] == "other"


def test_a_forged_marker_with_a_chosen_id_gets_a_full_injection() -> None:
    p = pod()
    p["metadata"]["labels"][LABEL_ID] = "victim"
    p["metadata"]["annotations"] = {
        ANN_INJECTED: "0.1.0",
        ANN_EXPIRES_AT: "9999-12-31T00:00:00Z",
        "sandman.dev/idle-timeout": "1s",
    }
    out, m = injected(p)
    assert out["metadata"]["labels"][LABEL_ID] == "abc123" == m.sandbox_id
    assert out["metadata"]["annotations"][ANN_EXPIRES_AT] == "2026-11-30T14:00:00Z"
    assert out["metadata"]["annotations"][ANN_INJECTED] == "9.9"
    assert [i["name"] for i in out["spec"]["initContainers"]] == [INIT_CONTAINER]


def test_a_reserved_name_without_an_injection_is_still_refused() -> None:
    # Only what is recognisably a previous injection is removed, never a
    # container of the user's that happens to use a reserved name.
    p = pod(initContainers=[{"name": INIT_CONTAINER, "image": "127.0.0.1:5000/mine:1"}])
    with pytest.raises(MutationError, match="reserved"):
        injected(p)


def test_every_container_loses_net_raw_and_what_the_policy_does_not_grant() -> None:
    p = pod(
        initContainers=[{"name": "setup", "image": "i"}],
        containers=[
            {"name": "main", "image": "i"},
            {
                "name": "web",
                "image": "i",
                "securityContext": {"capabilities": {"add": ["NET_BIND_SERVICE"]}},
            },
            {
                "name": "strict",
                "image": "i",
                "securityContext": {"capabilities": {"drop": ["ALL"]}},
            },
        ],
    )
    out, _ = injected(p)
    by_name = {c["name"]: c for c in out["spec"]["initContainers"] + out["spec"]["containers"]}
    for name in ("setup", "main", "web"):
        drop = by_name[name]["securityContext"]["capabilities"]["drop"]
        assert {"NET_RAW", "SYS_ADMIN", "NET_ADMIN", "SYS_PTRACE"} <= set(drop), name
        assert not {"CHOWN", "SETUID", "KILL"} & set(drop), name
    assert "NET_BIND_SERVICE" not in by_name["web"]["securityContext"]["capabilities"]["drop"]
    assert by_name["strict"]["securityContext"] == {"capabilities": {"drop": ["ALL"]}}
    # A policy may keep NET_RAW (ping) or keep nothing.
    ping = RuleSet(name="ping", default_capabilities=("NET_RAW", "CHOWN"))
    out, _ = injected(pod(), ping)
    drop = out["spec"]["containers"][0]["securityContext"]["capabilities"]["drop"]
    assert "NET_RAW" not in drop and "CHOWN" not in drop and "SETUID" in drop


def test_template_id_is_replaced_and_client_token_hash_kept() -> None:
    p = pod()
    p["metadata"]["labels"][LABEL_ID] = "copied-from-template"
    p["metadata"]["annotations"] = {ANN_TOKEN_SHA256: "a" * 64, ANN_TTL: "90m"}
    out, _ = injected(p)
    assert out["metadata"]["labels"][LABEL_ID] == "abc123"
    env = {e["name"]: e["value"] for e in out["spec"]["containers"][0]["env"]}
    assert env["SANDMAN_TOKEN_SHA256"] == "a" * 64
    assert out["metadata"]["annotations"][ANN_EXPIRES_AT] == "2026-11-30T13:30:00Z"


@pytest.mark.parametrize("ann", [{ANN_TOKEN_SHA256: "short"}, {ANN_TTL: "soon"}])
def test_contract_breaches_are_denied(ann: dict[str, str]) -> None:
    p = pod()
    p["metadata"]["annotations"] = ann
    with pytest.raises(MutationError):
        injected(p)


def test_reserved_names_and_port_clash() -> None:
    with pytest.raises(MutationError, match="reserved"):
        injected(pod(volumes=[{"name": VOLUME, "emptyDir": {}}]))
    with pytest.raises(MutationError, match="port 7878"):
        injected(pod(containers=[{"name": "m", "image": "i", "ports": [{"containerPort": 7878}]}]))


def test_policy_defaults_profiles_and_custom_scheduler() -> None:
    rule = RuleSet(
        name="r",
        runtime_class_name="gvisor",
        default_requests={"cpu": "500m", "memory": "1Gi"},
        default_limits={"memory": "512Mi"},
        profiles={
            "rollout": Profile("rollout"),
            "eval": Profile(
                "eval",
                guaranteed_qos=True,
                node_selector={"pool": "eval"},
                tolerations=({"key": "eval", "operator": "Exists"},),
            ),
        },
    )
    out, _ = injected(pod(schedulerName="my-scheduler"), rule)
    spec = out["spec"]
    assert spec["schedulerName"] == "my-scheduler"  # a deliberate scheduler is kept
    assert spec["runtimeClassName"] == "gvisor"
    res = spec["containers"][0]["resources"]
    # The 1Gi default request is above the 512Mi default limit: left out.
    assert res == {"requests": {"cpu": "500m"}, "limits": {"memory": "512Mi"}}
    p = pod()
    p["metadata"]["annotations"] = {"sandman.dev/profile": "eval"}
    out, _ = injected(p, rule)
    spec = out["spec"]
    assert spec["nodeSelector"] == {"pool": "eval"}
    assert spec["tolerations"] == [{"key": "eval", "operator": "Exists"}]
    res = spec["containers"][0]["resources"]
    assert res["requests"] == res["limits"] == {"cpu": "500m", "memory": "512Mi"}


def test_service_account_token_volume_added_by_admission_is_removed() -> None:
    # What the ServiceAccount admission plugin adds before any webhook runs.
    token_vol = {
        "name": "kube-api-access-x1y2z",
        "projected": {
            "sources": [
                {"serviceAccountToken": {"path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt"}},
            ]
        },
    }
    mount = {"name": "kube-api-access-x1y2z", "mountPath": "/var/run/secrets/kubernetes.io/sa"}
    p = pod(
        volumes=[{"name": "data", "emptyDir": {}}, token_vol],
        initContainers=[{"name": "init", "image": "i", "volumeMounts": [mount]}],
        containers=[
            {
                "name": "main",
                "image": "i",
                "volumeMounts": [{"name": "data", "mountPath": "/d"}, mount],
            },
            {"name": "side", "image": "i", "volumeMounts": [mount]},
        ],
    )
    out, _ = injected(p)
    spec = out["spec"]
    assert [v["name"] for v in spec["volumes"]] == ["data", VOLUME]
    assert spec["initContainers"][1]["volumeMounts"] == []
    assert [m["name"] for m in spec["containers"][0]["volumeMounts"]] == ["data", VOLUME]
    assert spec["containers"][1]["volumeMounts"] == []
    assert spec["automountServiceAccountToken"] is False


def test_install_step_passes_pod_security_restricted_and_has_limits() -> None:
    # The install step is admitted where PSA `restricted` or a ResourceQuota on
    # limits is enforced, and a pod with runAsNonRoot but no user still starts.
    p = pod(securityContext={"runAsNonRoot": True})
    out, _ = injected(p)
    init = out["spec"]["initContainers"][0]
    sc = init["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] > 0
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    for kind in ("requests", "limits"):
        assert set(init["resources"][kind]) == {"cpu", "memory"}, init["resources"]


def test_shared_mode_mounts_the_node_directory_read_only() -> None:
    from dataclasses import replace

    # On by the install-wide flag, or by a rule: either way the same pod.
    for settings, rule in (
        (replace(SETTINGS, daemon_delivery="shared", daemon_shared_dir="/srv/sd"), RULE),
        (replace(SETTINGS, daemon_shared_dir="/srv/sd"), RuleSet("r", daemon_delivery="shared")),
    ):
        out, _ = injected(pod(), rule=rule, settings=settings)
        spec = out["spec"]
        shared = next(v for v in spec["volumes"] if v["name"] == "sandman-daemon-shared")
        assert shared["hostPath"] == {"path": "/srv/sd", "type": "DirectoryOrCreate"}
        init = spec["initContainers"][0]
        assert init["command"][-2:] == ["--shared", "/sandman-shared"]
        assert init["securityContext"]["runAsUser"] == 0  # the node directory is root's
        mounts = spec["containers"][0]["volumeMounts"]
        assert {
            "name": "sandman-daemon-shared",
            "mountPath": "/.sandman/shared",
            "readOnly": True,
        } in mounts


def test_node_mode_has_no_install_step_and_mounts_the_nodes_tree_read_only() -> None:
    from dataclasses import replace

    from sandman.contract import daemon_release
    from sandman.webhook.mutate import delivery_for

    settings = replace(SETTINGS, daemon_shared_dir="/srv/sd", node_installer=True)
    release = f"/srv/sd/release/{daemon_release(settings.daemon_image)}"
    for s, rule in (
        (replace(settings, daemon_delivery="node"), RULE),
        (settings, RuleSet("r", daemon_delivery="node")),
    ):
        out, _ = injected(pod(), rule=rule, settings=s)
        spec = out["spec"]
        assert "initContainers" not in spec  # nothing runs before the daemon
        vol = next(v for v in spec["volumes"] if v["name"] == "sandman-daemon-shared")
        # Directory, not DirectoryOrCreate: on a node without the tree the
        # kubelet waits for it instead of running the daemon from nothing.
        assert vol["hostPath"] == {"path": release, "type": "Directory"}
        mounts = spec["containers"][0]["volumeMounts"]
        assert {"name": "sandman-daemon", "mountPath": "/.sandman"} in mounts
        assert {
            "name": "sandman-daemon-shared",
            "mountPath": "/.sandman/rt",
            "readOnly": True,
        } in mounts
        assert spec["containers"][0]["command"][0] == "/.sandman/rt/bin/sandmand"
    # A pod's own init containers stay, and the install step's name stays reserved.
    own = {"name": "setup", "image": "i", "command": ["true"]}
    out, _ = injected(pod(initContainers=[own]), settings=replace(settings, daemon_delivery="node"))
    assert [c["name"] for c in out["spec"]["initContainers"]] == ["setup"]
    with pytest.raises(MutationError, match="reserved"):
        injected(
            pod(initContainers=[dict(own, name="sandman-install")]),
            settings=replace(settings, daemon_delivery="node"),
        )
    enforce = "pod-security.kubernetes.io/enforce"
    mode, note = delivery_for("node", None, {enforce: "baseline"})
    assert mode == "copy" and note is not None and "baseline" in note


def test_the_delivery_an_injected_pod_got_reads_back() -> None:
    from dataclasses import replace

    from sandman.webhook.mutate import delivery_of

    for delivery in ("copy", "shared", "node"):
        settings = replace(SETTINGS, daemon_delivery=delivery, node_installer=True)
        out, _ = injected(pod(), settings=settings)
        assert delivery_of(out) == delivery


def test_the_node_delivery_without_a_node_installer_is_the_shared_one_with_a_warning() -> None:
    from dataclasses import replace

    from sandman.webhook.mutate import delivery_of

    # Asked for by a rule on an install without the node installer: the pod
    # would wait forever for a node directory nobody writes.
    rule = RuleSet("r", daemon_delivery="node")
    out, m = injected(pod(), rule=rule, settings=SETTINGS)
    assert delivery_of(out) == "shared"
    assert any("node installer" in w and "--delivery node" in w for w in m.warnings)
    out, m = injected(pod(), rule=rule, settings=replace(SETTINGS, node_installer=True))
    assert delivery_of(out) == "node"
    assert not any("node installer" in w for w in m.warnings)


def test_copy_mode_is_the_default_and_a_rule_can_opt_out_of_shared() -> None:
    from dataclasses import replace

    for settings, rule in (
        (SETTINGS, RULE),
        (replace(SETTINGS, daemon_delivery="shared"), RuleSet("r", daemon_delivery="copy")),
    ):
        out, m = injected(pod(), rule=rule, settings=settings)
        spec = out["spec"]
        assert not [v for v in spec["volumes"] if "hostPath" in v]
        assert "--shared" not in spec["initContainers"][0]["command"]
        assert not [w for w in m.warnings if "Pod Security" in w]


def test_namespaces_enforcing_pod_security_get_the_copy_with_a_warning() -> None:
    from sandman.webhook.mutate import delivery_for

    enforce = "pod-security.kubernetes.io/enforce"
    for level in ("baseline", "restricted"):
        mode, note = delivery_for("shared", None, {enforce: level})
        assert mode == "copy" and note is not None and level in note
        mode, note = delivery_for("copy", "shared", {enforce: level})
        assert mode == "copy" and note is not None
    assert delivery_for("shared", None, {enforce: "privileged"}) == ("shared", None)
    assert delivery_for("shared", None, {}) == ("shared", None)
    assert delivery_for("copy", None, {enforce: "restricted"}) == ("copy", None)
    # Through mutate: the patch passes `restricted`, the warning is returned.
    from dataclasses import replace

    m = mutate(
        pod(),
        rule=RULE,
        settings=replace(SETTINGS, daemon_delivery="shared"),
        now=NOW,
        new_id=lambda: "abc123",
        token_hash_for=lambda sid: "h" * 64,
        namespace_labels={enforce: "restricted"},
    )
    out = apply(pod(), m.patch)
    assert not [v for v in out["spec"]["volumes"] if "hostPath" in v]
    assert out["spec"]["initContainers"][0]["securityContext"]["runAsNonRoot"] is True
    assert any("Pod Security" in w for w in m.warnings)


def test_a_container_of_the_pod_may_not_mount_the_daemons_volumes() -> None:
    sneaky = {
        "name": "side",
        "image": "i",
        "volumeMounts": [{"name": "sandman-daemon-shared", "mountPath": "/x"}],
    }
    main = {"name": "main", "image": "i", "command": ["x"]}
    with pytest.raises(MutationError, match="reserved for the daemon"):
        injected(pod(containers=[main, sneaky]))
