"""`kubectl sandman shell` is an interactive terminal: typed into through a
pseudo-terminal, on the real node, over both SDK transports (direct to the
pod IP, and the apiserver's pods/proxy, which passes the WebSocket upgrade)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from sandman.client import Sandbox, SandmanClient
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.cluster.node import RealNode
from tests.pty_driver import PtyDriver

REAL = {"sandman.dev/node-kind": "real"}
PROMPT = "sbx$ "


def _plugin(cluster: LocalCluster, tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """kubectl, with the kubectl-sandman plugin on PATH, as a user has it."""
    bindir = Path(sys.executable).parent
    kubectl_dir = tmp_path / "bin"
    kubectl_dir.mkdir(exist_ok=True)
    if not (kubectl_dir / "kubectl").exists():
        (kubectl_dir / "kubectl").symlink_to(cluster.binaries.kubectl)
    env = {
        "PATH": f"{kubectl_dir}:{bindir}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "KUBECONFIG": str(cluster.kubeconfig),
        "TERM": "xterm-256color",
    }
    return ["kubectl", "sandman", "shell"], env


def _ask_until(drv: PtyDriver, command: str, want: str, timeout: float = 30.0) -> bytes:
    """Type ``command`` until its output shows ``want`` (a resize travels on
    its own message and may land after the next keystrokes)."""
    deadline = time.monotonic() + timeout
    while True:
        drv.type(command + "\r")
        seen = drv.expect(PROMPT)
        if want.encode() in seen or time.monotonic() > deadline:
            return seen


@pytest.mark.parametrize("transport", ["direct", "proxy"])
async def test_interactive_shell_python_repl_resize_ctrl_c_exit_code(
    cluster: LocalCluster,
    real_node: RealNode,
    namespace: str,
    images: dict[str, str],
    tmp_path: Path,
    transport: str,
) -> None:
    async with SandmanClient(kubeconfig=cluster.kubeconfig, namespace=namespace) as client:
        sb = await Sandbox.create(
            client, images["swe"], node_selector=REAL, command=["sleep", "3600"], ttl="20m"
        )
        # The shell's prompt, for reading where one command's output ends.
        await sb.exec(f"echo 'export PS1=\"{PROMPT}\"' >> /root/.bashrc")
        argv, env = _plugin(cluster, tmp_path)
        drv = PtyDriver(
            [*argv, sb.name, "-n", namespace, "--transport", transport],
            env=env,
            rows=30,
            cols=100,
            timeout=90,
        )
        try:
            drv.expect(PROMPT)
            # A real terminal of the window's size, and the user's TERM.
            seen = _ask_until(drv, "tty; stty size; echo $TERM", "30 100")
            assert b"/dev/pts/" in seen and b"30 100" in seen and b"xterm-256color" in seen
            drv.resize(40, 132)  # the window changes: SIGWINCH here, a resize there
            assert b"40 132" in _ask_until(drv, "stty size", "40 132")

            # A Python REPL: its prompt, an expression, Ctrl-C of a running call.
            drv.type("python3 -q\r")
            drv.expect(">>> ")
            drv.type("print(6 * 7)\r")
            assert b"42" in drv.expect(">>> ")
            drv.type("import os; os.get_terminal_size()\r")
            assert b"columns=132, lines=40" in drv.expect(">>> ")
            # Ctrl-C once the sleep runs (the marker is printed only by the
            # code, never by the echo of the line): typed in the same instant
            # as Enter, the byte reached readline before the line ran and the
            # sleep went on uninterrupted.
            drv.type("import time; print('sl' + 'eeping'); time.sleep(600)\r")
            drv.expect("sleeping")
            drv.type("\x03")  # raw mode: the byte goes to the sandbox's terminal
            assert b"KeyboardInterrupt" in drv.expect(">>> ")
            drv.type("exit()\r")
            drv.expect(PROMPT)

            # The shell's exit code is the command's.
            drv.type("exit 7\r")
            assert drv.wait() == 7
            assert drv.modes_restored(), "the local terminal was not restored"
        finally:
            drv.close()
            await sb.release()


async def test_full_screen_editor_in_a_busybox_sandbox(
    cluster: LocalCluster,
    real_node: RealNode,
    namespace: str,
    images: dict[str, str],
    tmp_path: Path,
) -> None:
    # busybox vi: a full-screen program (cursor addressing, raw keys, Esc).
    async with SandmanClient(kubeconfig=cluster.kubeconfig, namespace=namespace) as client:
        sb = await Sandbox.create(
            client, images["tiny"], node_selector=REAL, command=["sleep", "3600"], ttl="20m"
        )
        argv, env = _plugin(cluster, tmp_path)
        drv = PtyDriver([*argv, sb.name, "-n", namespace], env=env, timeout=90)
        try:
            drv.expect("# ")  # busybox sh, as root
            drv.type("vi /tmp/note.txt\r")
            drv.expect("vi /tmp/note.txt")  # the shell's echo of the line
            drv.expect("~")  # vi drew its screen: lines past the end of the file
            # As a person types: vi takes an Esc followed at once by more keys
            # for an escape sequence, so wait until it has drawn the text and
            # is back in command mode (its status line) before `:wq`.
            drv.type("ihello from vi\x1b")
            drv.expect("hello from vi")
            drv.expect("- /tmp/note.txt")
            drv.type(":wq\r")
            drv.expect("# ")
            drv.type("exit\r")
            assert drv.wait() == 0
            assert drv.modes_restored()
        finally:
            drv.close()
        assert (await sb.read_file("/tmp/note.txt")) == b"hello from vi\n"
        await sb.release()


async def test_exec_it_is_interactive_as_kubectl_exec_it(
    cluster: LocalCluster,
    real_node: RealNode,
    namespace: str,
    images: dict[str, str],
    tmp_path: Path,
) -> None:
    # `kubectl sandman exec -it POD -- sh`, typed as kubectl users type it: the
    # command (not the image's shell) on a terminal, keys going to it, its exit
    # code ours, the local terminal restored.
    async with SandmanClient(kubeconfig=cluster.kubeconfig, namespace=namespace) as client:
        sb = await Sandbox.create(
            client, images["tiny"], node_selector=REAL, command=["sleep", "3600"], ttl="20m"
        )
        _, env = _plugin(cluster, tmp_path)
        exec_it = ["kubectl", "sandman", "exec", "-it", sb.name, "-n", namespace]
        drv = PtyDriver([*exec_it, "--cwd", "/tmp", "--", "sh"], env=env, timeout=90)
        try:
            drv.expect("# ")  # busybox sh, as root
            drv.type("tty; pwd; echo $((6 * 7))\r")
            seen = drv.expect("# ")
            assert b"/dev/pts/" in seen and b"/tmp" in seen and b"42" in seen, seen
            drv.type("exit 5\r")
            assert drv.wait() == 5
            assert drv.modes_restored(), "the local terminal was not restored"
        finally:
            drv.close()
        await sb.release()
