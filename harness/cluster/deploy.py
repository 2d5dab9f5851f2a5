"""Sandman's own components on the local cluster, run as host processes.

In-cluster, the webhook is a Deployment behind a Service (manifests/). On the
local cluster the apiserver runs on the host, so the webhook does too and is
registered with a URL ``clientConfig`` (https://127.0.0.1:PORT/...); its
webhook configurations are the manifests' own, with only the clientConfig
swapped, so both modes test the same selectors and failure policies.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from kubernetes.client import AdmissionregistrationV1Api, CoreV1Api
from kubernetes.client.exceptions import ApiException

from sandman.contract import ANN_INJECTED, LABEL_SANDBOX, NAMESPACE
from sandman.harness.cluster import admission, overlay
from sandman.harness.cluster import reaper as reaper_proc
from sandman.harness.cluster.binaries import Binaries
from sandman.harness.cluster.components import Layout
from sandman.harness.cluster.config import ClusterConfig
from sandman.harness.cluster.extender import ready_url as extender_ready_url
from sandman.harness.cluster.extender import serve_argv as extender_argv
from sandman.harness.cluster.pki import ADMISSION_CLIENT_CN
from sandman.harness.cluster.process import ManagedProcess, wait_healthy, wait_until
from sandman.harness.kube import api_client
from sandman.harness.probes import http_ok

REPO_ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = REPO_ROOT / "manifests"
# The local cluster's policy (the same in both modes): every test and demo
# image comes from the local registry, so anything else is refused.
LOCAL_POLICY = yaml.safe_load((MANIFESTS / "overlays/local/policy.yaml").read_text())["data"][
    "policy.yaml"
]

Progress = Callable[[str], None]


class LocalDeployment:
    """Sandman's components for one local cluster as host processes. Not thread-safe.

    The opt-in mode (``--host-components``, and every cluster without the real
    node): quick to restart after an edit, no images. Its webhook
    configurations and policy come from the same rendered manifests as the
    in-cluster mode (``overlay.py``).
    """

    mode = "host"

    def __init__(
        self, config: ClusterConfig, layout: Layout, daemon_image: str, progress: Progress
    ) -> None:
        self.config = config
        self.layout = layout
        self.daemon_image = daemon_image
        self.progress = progress
        self.docs: list[dict[str, Any]] | None = None  # the rendered manifests, once up

    @property
    def webhook_url(self) -> str:
        return f"https://127.0.0.1:{self.config.ports.webhook}"

    def metrics_urls(self, component: str) -> list[str]:
        """/metrics of the host process of ``component`` (webhook, reaper, extender)."""
        ports = self.config.ports
        return {
            "webhook": [f"{self.webhook_url}/metrics"],
            "reaper": [f"http://127.0.0.1:{ports.reaper}/metrics"]
            if self.config.deploy_reaper
            else [],
            "extender": [f"http://127.0.0.1:{ports.extender}/metrics"],
        }[component]

    @property
    def policy_file(self) -> overlay.PolicyHandle:
        """The policy as a file-like handle (``read_text``/``write_text``)."""
        return self.policy

    @property
    def policy(self) -> overlay.PolicyHandle:
        """The policy ConfigMap; ``write`` returns once the webhook enforces it."""
        core = CoreV1Api(api_client(self.layout.admin_kubeconfig))
        return overlay.PolicyHandle(core, lambda: [self.webhook_url + "/metrics"])

    def _webhook(self) -> ManagedProcess:
        return next(p for p in self.processes() if p.name == "sandman-webhook")

    def stop_webhook(self) -> None:
        """Stop serving admissions (the configurations stay: sandbox creates fail)."""
        self._webhook().stop()

    def start_webhook(self) -> None:
        proc = self._webhook()
        proc.start()
        wait_healthy(
            proc,
            self.health_checks()[proc.name],
            timeout_s=self.config.start_timeout_s,
            progress=self.progress,
        )
        self._register(proc)

    def wait_restarted(self, since: datetime) -> None:
        """Return once every component answers its readiness check: they run on
        the host, so a restart of the node (at ``since``) does not restart them."""
        checks = self.health_checks()
        for proc in self.processes():
            wait_healthy(
                proc,
                checks[proc.name],
                timeout_s=self.config.start_timeout_s,
                progress=self.progress,
            )

    def processes(self) -> list[ManagedProcess]:
        argv = [
            sys.executable,
            "-m",
            "sandman.webhook",
            "serve",
            f"--listen=127.0.0.1:{self.config.ports.webhook}",
            f"--kubeconfig={self.layout.admin_kubeconfig}",
            f"--namespace={NAMESPACE}",
            f"--daemon-image={self.daemon_image}",
            f"--policy-configmap={NAMESPACE}/{overlay.POLICY_CONFIGMAP}",
            "--extra-ip=127.0.0.1",
            f"--work-dir={self.layout.state_dir / 'webhook'}",
            # Reviews only from the apiserver (harness/cluster/admission.py).
            f"--client-ca-file={admission.client_ca(self.layout.pki)}",
            f"--client-cn={ADMISSION_CLIENT_CN}",
        ]
        # The host-run schedulers do without leader election, so they hold no
        # Lease to judge them by (webhook/schedulers.py): not checked here.
        argv += ["--scheduler-lease=default-scheduler=", "--scheduler-lease=sandman-scheduler="]
        if not self.config.real_node.enabled:
            # No real node, no registry: kwok pods never run, so there is no
            # ENTRYPOINT/CMD to read (and 127.0.0.1:5000 may be another
            # cluster's registry).
            argv.append("--image-config-lookup=off")
        else:
            # The local registry is on loopback, which lookups never reach
            # unless listed (sandman/netguard.py).
            argv.append(f"--lookup-allow-address={self.config.real_node.registry}")
        procs = [ManagedProcess("sandman-webhook", tuple(argv), self.layout.run, self.layout.logs)]
        procs.append(
            ManagedProcess(
                "sandman-extender",
                tuple(extender_argv(self.config.ports.extender, self.layout.admin_kubeconfig)),
                self.layout.run,
                self.layout.logs,
            )
        )
        if self.config.deploy_reaper:
            reaper = reaper_proc.serve_argv(
                self.config.ports.reaper,
                self.layout.admin_kubeconfig,
                extra=[f"--namespace={NAMESPACE}"],
            )
            procs.append(
                ManagedProcess("sandman-reaper", tuple(reaper), self.layout.run, self.layout.logs)
            )
        return procs

    def health_checks(self) -> dict[str, Callable[[], bool]]:
        ports = self.config.ports
        return {
            "sandman-webhook": lambda: http_ok(self.webhook_url + "/readyz", insecure=True),
            "sandman-reaper": lambda: http_ok(reaper_proc.url(ports.reaper, "/readyz")),
            "sandman-extender": lambda: http_ok(extender_ready_url(ports.extender)),
        }

    def _rendered(self) -> list[dict[str, Any]]:
        kubectl = Binaries.in_cache(self.config.cache_dir, self.config.versions).kubectl
        kc = overlay.kubectl(kubectl, self.layout.admin_kubeconfig)
        # The tag the daemon image has is the one version of every image.
        version = self.daemon_image.rsplit(":", 1)[1]
        return overlay.rendered(kc, overlay.write(self.config, version))

    def up(self) -> None:
        core = CoreV1Api(api_client(self.layout.admin_kubeconfig))
        self.docs = self._rendered()
        try:
            core.create_namespace(overlay.pick(self.docs, "Namespace", NAMESPACE))
        except ApiException as e:
            if e.status != 409:
                raise
        overlay.apply_policy_configmap(core, self.docs)
        webhook, *others = self.processes()
        checks = self.health_checks()
        webhook.start()
        wait_healthy(
            webhook,
            checks[webhook.name],
            timeout_s=self.config.start_timeout_s,
            progress=self.progress,
        )
        self._register(webhook)
        # The reaper after the webhook (the cluster key it reads is the
        # webhook's); the extender any time (sandman-scheduler ignores it
        # while it is down).
        for proc in others:
            proc.start()
            wait_healthy(
                proc,
                checks[proc.name],
                timeout_s=self.config.start_timeout_s,
                progress=self.progress,
            )

    def _register(self, proc: ManagedProcess) -> None:
        """Create/update the webhook configurations, then prove admission works."""
        adm = AdmissionregistrationV1Api(api_client(self.layout.admin_kubeconfig))
        core = CoreV1Api(api_client(self.layout.admin_kubeconfig))
        ca = self._ca_bundle(core)
        docs = self.docs or self._rendered()
        for doc in overlay.url_webhook_configurations(docs, self.webhook_url, ca):
            name = doc["metadata"]["name"]
            mutating = doc["kind"] == "MutatingWebhookConfiguration"
            create = (
                adm.create_mutating_webhook_configuration
                if mutating
                else adm.create_validating_webhook_configuration
            )
            replace = (
                adm.replace_mutating_webhook_configuration
                if mutating
                else adm.replace_validating_webhook_configuration
            )
            read = (
                adm.read_mutating_webhook_configuration
                if mutating
                else adm.read_validating_webhook_configuration
            )
            try:
                create(doc)
            except ApiException as e:
                if e.status != 409:
                    raise
                current = read(name)
                doc["metadata"]["resourceVersion"] = current.metadata.resource_version
                replace(name, doc)

        def injects() -> bool:
            # A server-side dry run goes through both webhooks and changes nothing.
            # A command of its own: admission then never needs the image's
            # registry for ENTRYPOINT/CMD (there is none without the real node).
            pod = {
                "metadata": {"generateName": "probe-", "labels": {LABEL_SANDBOX: "true"}},
                "spec": {
                    "containers": [
                        {
                            "name": "c",
                            "image": "127.0.0.1:5000/sandman/tiny:1",
                            "command": ["sleep", "1"],
                        }
                    ]
                },
            }
            got = core.create_namespaced_pod("default", pod, dry_run="All", _preload_content=False)
            return ANN_INJECTED in json.loads(got.data)["metadata"].get("annotations", {})

        t0 = time.monotonic()
        wait_until(
            proc, injects, timeout_s=self.config.start_timeout_s, what="injecting a dry-run sandbox"
        )
        self.progress(f"  webhook registered ({time.monotonic() - t0:.1f}s): {self.webhook_url}")

    def _ca_bundle(self, core: CoreV1Api) -> str | None:
        try:
            s = core.read_namespaced_secret("sandman-webhook-tls", NAMESPACE)
        except ApiException:
            return None
        return (s.data or {}).get("ca-bundle.crt")

    def down(self) -> list[str]:
        return [p.name for p in self.processes() if p.stop()]
