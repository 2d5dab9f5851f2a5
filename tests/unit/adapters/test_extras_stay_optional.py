"""The core install stays light: importing the SDK, the CLI, fleets and their report
(plot and trace modules included) pulls in none of the adapters' extras."""

from __future__ import annotations

import subprocess
import sys

CORE_MODULES = [
    "sandman.client",
    "sandman.client.sync",
    "sandman.cli.main",
    "sandman.cli.fleet",
    "sandman.fleet.fleet",
    "sandman.fleet.report",
    "sandman.fleet.plot",
    "sandman.fleet.trace",
    "sandman.adapters.e2b.gateway",  # the gateway itself needs only aiohttp
    "sandman.adapters.e2b.envd",
    "sandman.adapters.e2b.api",
]
EXTRAS = ["matplotlib", "numpy", "gymnasium", "swerex", "e2b", "pydantic", "PIL"]


def test_core_modules_import_no_extra() -> None:
    code = (
        "import sys\n"
        f"for m in {CORE_MODULES!r}: __import__(m)\n"
        f"print(sorted(m for m in {EXTRAS!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
