"""A picture of the Grafana dashboard from a real run, without Grafana.

No Grafana package is reachable here, so: run a workload on a local cluster
(warm-pool and on-demand fleets, a policy denial, sandboxes left to expire),
scrape every component's ``/metrics`` every ``--interval`` seconds while it
runs (webhook, extender, reaper, the SDK process's endpoint, and each
sandbox's daemon with its token), write the samples as OpenMetrics, load them
into a fresh Prometheus TSDB with ``promtool tsdb create-blocks-from
openmetrics``, start Prometheus (Debian's ``prometheus``) on loopback over
that data, evaluate each panel's queries with its range API, and draw the
panels on the dashboard's grid with matplotlib (``sandman.telemetry.render``).

    python -m sandman.harness.dashboard_snapshot --state-dir DIR --out docs/images/dashboard.png

The cluster must run with ``--real-node --deploy`` (webhook, extender, reaper).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from sandman.client import Sandbox, SandmanClient
from sandman.contract import DAEMON_PORT, LABEL_ID, LABEL_SANDBOX
from sandman.fleet.fleet import Fleet, FleetConfig, Problem
from sandman.harness.cluster.kwok_nodes import KWOK_IMAGE, KWOK_TOLERATION, NODE_KIND_LABEL
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.images.build import ImageBuilder
from sandman.harness.probes import insecure_context
from sandman.harness.testing import free_port
from sandman.kube_async import NAMESPACES, PODS, ApiError
from sandman.pools import NoIdlePod, PoolSpec
from sandman.pools.manager import ManagerConfig, PoolManager
from sandman.telemetry import Telemetry
from sandman.telemetry.promql import dashboard_exprs
from sandman.telemetry.render import legend, render
from sandman.telemetry.sdkmetrics import SdkMetrics

REPO = Path(__file__).resolve().parents[1]
DASHBOARD = REPO / "manifests" / "monitoring" / "sandman-dashboard.json"
REAL = {NODE_KIND_LABEL: "real"}
# $__rate_interval in Grafana is at least four scrape intervals.
RATE_WINDOWS = 4


@dataclass
class Recording:
    """Samples as scraped: (job, instance) -> [(unix time, exposition text)]."""

    scrapes: dict[tuple[str, str], list[tuple[float, str | None]]] = field(
        default_factory=lambda: defaultdict(list)
    )

    def openmetrics(self) -> str:
        """Every sample with job/instance labels and its scrape time, grouped by
        metric name (OpenMetrics forbids interleaving families); ``up`` added
        per scrape as Prometheus would."""
        fams: dict[str, list[tuple[float, str]]] = defaultdict(list)
        for (job, inst), rows in self.scrapes.items():
            extra = f'job="{job}",instance="{inst}"'
            for t, text in rows:
                fams["up"].append((t, f"up{{{extra}}} {1 if text is not None else 0} {t:.3f}"))
                for line in (text or "").splitlines():
                    if not line or line.startswith("#"):
                        continue
                    name_labels, _, value = line.rpartition(" ")
                    if value in ("NaN", "+Inf", "-Inf"):
                        continue
                    if "{" in name_labels:
                        name, rest = name_labels.split("{", 1)
                        labels = "{" + extra + ("," + rest if rest != "}" else "}")
                    else:
                        name, labels = name_labels, "{" + extra + "}"
                    fams[name].append((t, f"{name}{labels} {value} {t:.3f}"))
        out = []
        for name in sorted(fams):
            out += [line for _, line in sorted(fams[name], key=lambda r: r[0])]
        return "\n".join(out) + "\n# EOF\n"


class Scraper:
    """Scrapes the components and every sandbox daemon of ``namespaces``."""

    def __init__(
        self, cluster: LocalCluster, client: SandmanClient, sdk_port: int, namespaces: list[str]
    ) -> None:
        p = cluster.config.ports
        self.static = {
            ("sandman-webhook", f"127.0.0.1:{p.webhook}"): f"https://127.0.0.1:{p.webhook}/metrics",
            (
                "sandman-extender",
                f"127.0.0.1:{p.extender}",
            ): f"http://127.0.0.1:{p.extender}/metrics",
            ("sandman-reaper", f"127.0.0.1:{p.reaper}"): f"http://127.0.0.1:{p.reaper}/metrics",
            ("sandman-sdk", f"127.0.0.1:{sdk_port}"): f"http://127.0.0.1:{sdk_port}/metrics",
        }
        self.client, self.namespaces = client, namespaces
        self.rec = Recording()

    async def _get(
        self, http: aiohttp.ClientSession, url: str, token: str | None = None
    ) -> str | None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            ssl = insecure_context() if url.startswith("https") else None
            async with http.get(
                url, headers=headers, ssl=ssl, timeout=aiohttp.ClientTimeout(total=5)
            ) as r:
                return await r.text() if r.status == 200 else None
        except (aiohttp.ClientError, TimeoutError):
            return None

    async def once(self, http: aiohttp.ClientSession) -> None:
        t = time.time()
        jobs = [(key, self._get(http, url)) for key, url in self.static.items()]
        for ns in self.namespaces:
            pods = (await self.client.kube.list(PODS, ns, label_selector=f"{LABEL_SANDBOX}=true"))[
                "items"
            ]
            for pod in pods:
                ip = (pod.get("status") or {}).get("podIP")
                sid = ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_ID)
                if not ip or not sid or (pod.get("status") or {}).get("phase") != "Running":
                    continue
                token = await self.client.token_for(ns, sid)
                url = f"http://{ip}:{DAEMON_PORT}/metrics"
                key = ("sandman-daemon", f"{ip}:{DAEMON_PORT}")
                jobs.append((key, self._get(http, url, token)))
        texts = await asyncio.gather(*(j for _, j in jobs))
        for (key, _), text in zip(jobs, texts, strict=True):
            self.rec.scrapes[key].append((t, text))

    async def run(self, stop: asyncio.Event, interval: float) -> None:
        async with aiohttp.ClientSession() as http:
            while not stop.is_set():
                t0 = time.monotonic()
                try:
                    await self.once(http)
                except (ApiError, aiohttp.ClientError, OSError) as e:
                    print(f"scrape failed: {e}", file=sys.stderr)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        stop.wait(), max(0.1, interval - (time.monotonic() - t0))
                    )


async def task(sb: Sandbox, problem: Problem, rollout: int) -> float:
    """A rollout: a few commands, as an agent would run them."""
    await sb.exec(["sh", "-c", "echo start; ls / >/dev/null"])
    await sb.write_file("/tmp/answer.txt", f"{problem.id} {rollout}\n")
    r = await sb.exec(["sh", "-c", f"sleep 0.{2 + rollout % 5}; cat /tmp/answer.txt"])
    return 1.0 if r.exit_code == 0 else 0.0


async def agents(client: SandmanClient, image: str, stop: asyncio.Event) -> None:
    """Two long-lived sandboxes running a quick command every half second (an
    agent's loop): the daemons' exec latency and requests in flight over the
    whole run."""
    boxes = [
        await Sandbox.create(
            client, image, ttl="30m", node_selector=REAL, command=["sleep", "3600"]
        )
        for _ in range(2)
    ]

    async def loop(sb: Sandbox) -> None:
        i = 0
        while not stop.is_set():
            await sb.exec(["true"] if i % 2 else ["echo", f"step {i}"])  # quick: the daemon's cost
            i += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)

    try:
        await asyncio.gather(*(loop(sb) for sb in boxes))
    finally:
        for sb in boxes:
            await sb.release()


async def kwok_pool(client: SandmanClient, ns: str) -> None:
    """A warm pool on the kwok nodes (3 candidates, so the scheduler asks the
    extender to rank them; real-node pods have one candidate and skip it)."""
    spec = PoolSpec(
        "kwok",
        KWOK_IMAGE,
        size=6,
        command=["sleep", "infinity"],
        node_selector={NODE_KIND_LABEL: "kwok"},
        tolerations=[KWOK_TOLERATION],
    )
    async with PoolManager(
        client.kube, ns, ManagerConfig(create_rate=3, create_burst=3), telemetry=client.telemetry
    ) as pm:
        await pm.ensure(spec)
        for _ in range(8):
            await asyncio.sleep(4)
            with contextlib.suppress(NoIdlePod):
                res = await pm.claim(
                    "kwok", claimer="snapshot", ttl=dt.timedelta(minutes=2), wait_s=2
                )
                await client.kube.delete(PODS, res.pod["metadata"]["name"], ns)
        await pm.delete("kwok")


async def workload(client: SandmanClient, image: str, ns: str) -> None:
    stop = asyncio.Event()
    background = [
        asyncio.create_task(agents(client, image, stop)),
        asyncio.create_task(kwok_pool(client, ns)),
    ]
    try:
        await fleets(client, image, ns)
    finally:
        stop.set()
        await asyncio.gather(*background)


async def fleets(client: SandmanClient, image: str, ns: str) -> None:
    common = dict(
        ttl="10m",
        node_selector=REAL,
        command=["sleep", "3600"],
        pools=ManagerConfig(create_rate=5, create_burst=5),
    )
    problems = [Problem(f"p{i}", image) for i in range(4)]
    print("fleet: warm pools (naive), 4 problems x 3 rollouts", file=sys.stderr)
    await Fleet(client, FleetConfig(strategy="naive", concurrency=4, **common)).run(
        problems, 3, task
    )
    print("fleet: on demand (none), 4 problems x 2 rollouts", file=sys.stderr)
    await Fleet(client, FleetConfig(strategy="none", concurrency=4, **common)).run(
        problems, 2, task
    )
    print("policy denials and sandboxes left to expire", file=sys.stderr)
    for i in range(3):
        main = {"name": "main", "image": image, "securityContext": {"privileged": True}}
        body = {
            "metadata": {"name": f"denied-{i}", "labels": {LABEL_SANDBOX: "true"}},
            "spec": {"nodeSelector": REAL, "containers": [main]},
        }
        with contextlib.suppress(ApiError):
            await client.kube.create(PODS, body, ns)
    left = []
    for _ in range(3):
        left.append(
            await Sandbox.create(
                client, image, ttl="20s", node_selector=REAL, command=["sleep", "3600"]
            )
        )
    for sb in left:
        await sb.exec(["true"])
    await asyncio.sleep(45)  # the reaper reclaims them at their lease's end


def query_range(
    base: str, expr: str, start: float, end: float, step: float
) -> list[dict[str, Any]]:
    q = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"{base}/api/v1/query_range?{q}", timeout=30) as r:
        doc = json.load(r)
    if doc.get("status") != "success":
        raise RuntimeError(f"{expr}: {doc}")
    return doc["data"]["result"]  # type: ignore[no-any-return]


def span_of(openmetrics: str) -> tuple[float, float, int]:
    """(first scrape, last scrape, scrape targets) of recorded samples."""
    times, targets = [], set()
    for line in openmetrics.splitlines():
        if line.startswith("up{"):
            labels, _, rest = line.partition("} ")
            targets.add(labels)
            times.append(float(rest.split()[1]))
    return min(times), max(times), len(targets)


def evaluate(
    openmetrics: str, dashboard: dict[str, Any], interval: float, work: Path
) -> dict[int, list]:
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    prometheus = shutil.which("prometheus") or "/usr/bin/prometheus"
    om = work / "samples.om"
    if not om.exists() or om.read_text() != openmetrics:
        om.write_text(openmetrics)
    data = work / "tsdb"
    shutil.rmtree(data, ignore_errors=True)
    data = work / "tsdb"
    subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), str(data)],
        check=True,
        capture_output=True,
    )
    cfg = work / "prometheus.yml"
    cfg.write_text("global: {scrape_interval: 1h}\n")
    port = free_port()
    proc = subprocess.Popen(
        [
            prometheus,
            f"--config.file={cfg}",
            f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{port}",
            # Backfilled blocks carry no staleness markers: without a short
            # lookback a vanished series (a deleted sandbox's daemon, a phase
            # nobody is in any more) would hold its last value for 5 minutes.
            f"--query.lookback-delta={max(5, math.ceil(2.5 * interval))}s",
            "--storage.tsdb.retention.time=3650d",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(work / "prometheus.log").open("w"),
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{base}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"prometheus did not start: {(work / 'prometheus.log').read_text()[-2000:]}"
                )
            time.sleep(0.5)
        start, end, _ = span_of(openmetrics)
        window = f"{math.ceil(RATE_WINDOWS * interval)}s"
        results: dict[int, list] = {}
        for p in dashboard["panels"]:
            for t in p.get("targets", []):
                expr = t["expr"].replace("$__rate_interval", window)
                for s in query_range(base, expr, start, end, interval):
                    pts = [(float(ts), float(v)) for ts, v in s["values"]]
                    if p["type"] == "table":
                        pts = pts[-1:]
                    results.setdefault(p["id"], []).append(
                        (legend(t.get("legendFormat", ""), s["metric"]), pts)
                    )
        return results
    finally:
        proc.terminate()
        proc.wait(30)


async def record(cluster: LocalCluster, ns: str, interval: float) -> Recording:
    node = cluster.real_node
    if node is None:
        raise SystemExit("this needs a cluster with --real-node --deploy")
    image = ImageBuilder(cluster.config.cache_dir).build_and_push("tiny", node.registry).ref
    tel = Telemetry(metrics=SdkMetrics(), listen=("127.0.0.1", 0))
    async with SandmanClient(kubeconfig=cluster.kubeconfig, namespace=ns, telemetry=tel) as client:
        try:
            await client.kube.create(NAMESPACES, {"metadata": {"name": ns}})
        except ApiError as e:
            if not e.conflict:
                raise
        assert tel.port is not None
        scraper = Scraper(cluster, client, tel.port, [ns])
        stop = asyncio.Event()
        scraping = asyncio.create_task(scraper.run(stop, interval))
        await asyncio.sleep(3 * interval)  # a quiet start, as a dashboard would show it
        try:
            await workload(client, image, ns)
            await asyncio.sleep(3 * interval)
        finally:
            stop.set()
            await scraping
    return scraper.rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sandman.harness.dashboard_snapshot")
    ap.add_argument("--state-dir", type=Path, help="the cluster to run on (not with --samples)")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "images" / "dashboard.png")
    ap.add_argument("--namespace", default="obs-demo")
    ap.add_argument("--interval", type=float, default=2.0, help="scrape interval, seconds")
    ap.add_argument("--keep", type=Path, default=None, help="keep samples and TSDB here")
    ap.add_argument(
        "--samples", type=Path, default=None, help="render kept samples.om again, run nothing"
    )
    args = ap.parse_args(argv)
    if args.samples is not None:
        om = args.samples.read_text()
    elif args.state_dir is None:
        ap.error("--state-dir (a cluster up with --real-node --deploy) or --samples")
    else:
        cluster = LocalCluster.at(args.state_dir)
        om = asyncio.run(record(cluster, args.namespace, args.interval)).openmetrics()
    dashboard = json.loads(DASHBOARD.read_text())
    work = args.keep or Path(tempfile.mkdtemp(prefix="sandman-dashboard-"))
    work.mkdir(parents=True, exist_ok=True)
    results = evaluate(om, dashboard, args.interval, work)
    start, end, targets = span_of(om)
    when = dt.datetime.fromtimestamp(start, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    subtitle = (
        f"Static render of manifests/monitoring/sandman-dashboard.json from a real run on the "
        f"local cluster ({when}, {end - start:.0f} s, {targets} scrape targets every "
        f"{args.interval:g} s; queries evaluated by Prometheus over the recorded samples)"
    )
    render(dashboard, results, args.out, span=(start, end), subtitle=subtitle)
    n = len(list(dashboard_exprs(dashboard)))
    print(f"{args.out}: {len(results)} panels with data, {n} queries; samples in {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
