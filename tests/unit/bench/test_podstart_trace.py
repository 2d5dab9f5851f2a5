"""Reading a sandbox's start from containerd's log and the runtime's records."""

from __future__ import annotations

import pytest

from sandman.bench import podstart_trace as trace

UID = "9239ca99-8944-403e-8e0f-cea616eb3772"
SID = "19873c02ec83f440a56792a48d3deffc2b838da53f48bf1c9ef89ac5721a8ded"
INIT_ID = "aa" * 32
MAIN_ID = "bb" * 32
META = f"&PodSandboxMetadata{{Name:l1-r0-0,Uid:{UID},Namespace:bench,Attempt:0,}}"


def line(t: str, msg: str) -> str:
    return f'time="2026-12-01T10:17:{t}Z" level=info msg="{msg}"'


# The lines as containerd 1.6 writes them (quotes inside msg are escaped).
LOG = [
    line("53.100000000", f"RunPodSandbox for {META}"),
    line("53.050000000", "RunPodSandbox for &PodSandboxMetadata{Name:x,Uid:other,Namespace:y,}"),
    line("53.400000000", f'RunPodSandbox for {META} returns sandbox id \\"{SID}\\"'),
    line(
        "53.450000000",
        f'CreateContainer within sandbox \\"{SID}\\" for container '
        "&ContainerMetadata{Name:sandman-install,Attempt:0,}",
    ),
    line(
        "53.470000000",
        f'CreateContainer within sandbox \\"{SID}\\" for '
        "&ContainerMetadata{Name:sandman-install,Attempt:0,} "
        f'returns container id \\"{INIT_ID}\\"',
    ),
    line("53.480000000", f'StartContainer for \\"{INIT_ID}\\"'),
    line("53.600000000", f'StartContainer for \\"{INIT_ID}\\" returns successfully'),
    'time="2026-12-01T10:17:53.700000000Z" level=debug msg="noise"',
    line(
        "54.500000000",
        f'CreateContainer within sandbox \\"{SID}\\" for container '
        "&ContainerMetadata{Name:main,Attempt:0,}",
    ),
    line(
        "54.520000000",
        f'CreateContainer within sandbox \\"{SID}\\" for '
        f'&ContainerMetadata{{Name:main,Attempt:0,}} returns container id \\"{MAIN_ID}\\"',
    ),
    line("54.530000000", f'StartContainer for \\"{MAIN_ID}\\"'),
    line("54.650000000", f'StartContainer for \\"{MAIN_ID}\\" returns successfully'),
    # A restart (Attempt:1) is not the start being measured.
    line(
        "59.000000000",
        f'CreateContainer within sandbox \\"{SID}\\" for container '
        "&ContainerMetadata{Name:main,Attempt:1,}",
    ),
]
T0 = trace.parse_time("2026-12-01T10:17:00Z")


def test_nanosecond_times_keep_their_fraction() -> None:
    assert trace.parse_time("2026-12-01T10:17:53.123456789Z") - T0 == pytest.approx(53.123456789)
    assert trace.parse_time("2026-12-01T10:17:53+00:00") - T0 == 53
    with pytest.raises(ValueError):
        trace.parse_time("yesterday")


def test_containerd_log_gives_each_cri_call_of_the_pod() -> None:
    got = trace.containerd_times(LOG, {UID})
    assert list(got) == [UID]  # the other pod is filtered out
    sb = got[UID]
    assert sb.sandbox_id == SID and sb.name == "l1-r0-0"
    assert (sb.begin - T0, sb.end - T0) == pytest.approx((53.1, 53.4))
    init, main = sb.containers["sandman-install"], sb.containers["main"]
    assert init.id == INIT_ID and main.id == MAIN_ID
    assert main.create_begin - T0 == pytest.approx(54.5)  # attempt 0, not the restart
    assert (init.start_begin - T0, init.start_end - T0) == pytest.approx((53.48, 53.6))


def test_phases_are_consecutive_and_add_up() -> None:
    tr = trace.PodTrace("l1-r0-0", UID)
    tr.cri = trace.containerd_times(LOG)[UID]
    tr.requested, tr.created, tr.scheduled = T0 + 52.9, T0 + 52.95, T0 + 53.0
    tr.init_finished = T0 + 53.9
    tr.daemon_serving = T0 + 54.8
    tr.sdk_ready, tr.first_result = T0 + 55.5, T0 + 55.52
    ph = trace.phases(tr, init="sandman-install", main="main")
    assert ph["after_init_wait"] == pytest.approx(0.6)  # 53.9 -> 54.5: the kubelet's relist
    assert ph["daemon_start"] == pytest.approx(0.15)
    assert ph["readiness"] == pytest.approx(0.7)
    parts = sum(v for k, v in ph.items() if k != "total")
    assert parts == pytest.approx(ph["total"]) and ph["total"] == pytest.approx(2.62)


def test_a_pod_without_init_container_has_zero_init_phases() -> None:
    log = [ln for ln in LOG if "sandman-install" not in ln and INIT_ID not in ln]
    tr = trace.PodTrace("l1-r0-0", UID, requested=T0 + 53.0, first_result=T0 + 55.0)
    tr.cri = trace.containerd_times(log)[UID]
    ph = trace.phases(tr, init="sandman-install", main="main")
    assert ph["init_create_start"] == ph["init_run"] == 0.0
    assert ph["after_init_wait"] == pytest.approx(54.5 - 53.4)


def test_missing_instants_give_none_and_summary_skips_them() -> None:
    ph = trace.phases(trace.PodTrace("x"), init="i", main="m")
    assert ph["admission"] is None and ph["total"] is None
    rows = [{"total": 1.0, "a": None}, {"total": 3.0, "a": 0.5}, {"total": 2.0, "a": None}]
    assert trace.summary(rows, 50) == {"total": 2000.0, "a": 500.0}


def test_cri_log_lines_and_crictl_records() -> None:
    lines = [
        "2026-12-01T10:17:54.700000001Z stderr F starting",
        '2026-12-01T10:17:54.800000002Z stderr F {"msg": "serving on 0.0.0.0:7878"}',
    ]
    assert trace.log_line_time(lines, "serving on") - T0 == pytest.approx(54.800000002)
    assert trace.log_line_time(lines, "never") is None
    doc = {"status": {"startedAt": "2026-12-01T10:17:53.6Z", "finishedAt": "0001-01-01T00:00:00Z"}}
    started, finished = trace.crictl_times(doc)
    assert started - T0 == pytest.approx(53.6) and finished is None
