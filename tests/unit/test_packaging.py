"""What a wheel built from this repo contains, read from pyproject.toml.

An install from a wheel (`pip install sandman-k8s`, no checkout) has only the
packages and package data pyproject.toml names: a package left out breaks
the commands that import it (`sandman image` did, once), a data file left
out breaks what reads it (the monitoring overlay's dashboard). The wheel
itself is built and used in tests/integration/test_wheel_install.py.
"""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from sandman.cli.main import COMMANDS, MODULE_EXTRAS, missing_module_advice

REPO = Path(__file__).resolve().parents[2]
CONFIG = tomllib.loads((REPO / "pyproject.toml").read_text())
SETUPTOOLS = CONFIG["tool"]["setuptools"]
PACKAGES: list[str] = SETUPTOOLS["packages"]
PACKAGE_DIR: dict[str, str] = SETUPTOOLS["package-dir"]
PACKAGE_DATA: dict[str, list[str]] = SETUPTOOLS["package-data"]

# Source files that stay in the checkout on purpose (notes for the daemon's
# maintainers, read on GitHub).
NOT_SHIPPED = {"daemon/API.md", "daemon/freeze/README.md"}


def source_dir(pkg: str) -> Path:
    """Where setuptools takes ``pkg`` from (the longest mapped prefix decides)."""
    base = max((k for k in PACKAGE_DIR if pkg == k or pkg.startswith(k + ".")), key=len)
    rest = pkg[len(base) :].lstrip(".")
    return REPO / PACKAGE_DIR[base] / Path(*rest.split(".")) if rest else REPO / PACKAGE_DIR[base]


def source_packages() -> dict[str, Path]:
    """Every Python package (a dir with __init__.py) under the mapped source dirs."""
    out: dict[str, Path] = {}
    for top, rel in PACKAGE_DIR.items():
        root = REPO / rel
        for init in root.rglob("__init__.py"):
            parts = init.parent.relative_to(root).parts
            if "__pycache__" in parts:
                continue
            out[".".join((top, *parts))] = init.parent
    return out


def test_every_source_package_is_in_the_wheel() -> None:
    missing = sorted(set(source_packages()) - set(PACKAGES))
    assert not missing, f"packages not in pyproject.toml's [tool.setuptools] packages: {missing}"


def test_every_command_module_is_in_a_shipped_package() -> None:
    for command, (module, _help) in COMMANDS.items():
        pkg = module.rpartition(".")[0]
        assert pkg in PACKAGES, f"`sandman {command}` imports {module}, not in the wheel"


def _shipped(pkg: str, rel: str) -> bool:
    # setuptools globs package data relative to the package dir; `*` stays
    # within one path component there, as fnmatch's does not: compare per part.
    for pattern in PACKAGE_DATA.get(pkg, []):
        pat_parts, rel_parts = pattern.split("/"), rel.split("/")
        if len(pat_parts) == len(rel_parts) and all(
            fnmatch.fnmatchcase(r, p) for r, p in zip(rel_parts, pat_parts, strict=True)
        ):
            return True
    return False


def test_every_data_file_is_shipped() -> None:
    """Each non-Python file under a package dir is package data of the package
    that owns it (the deepest), or listed in NOT_SHIPPED."""
    pkgs = {pkg: source_dir(pkg) for pkg in PACKAGES}
    unshipped = []
    for pkg, root in pkgs.items():
        for f in root.rglob("*"):
            if not f.is_file() or f.suffix in (".py", ".pyc") or "__pycache__" in f.parts:
                continue
            owner = max(
                (p for p, d in pkgs.items() if f.is_relative_to(d)),
                key=lambda p: len(pkgs[p].parts),
            )
            if owner != pkg:
                continue
            rel = f.relative_to(root).as_posix()
            checkout_rel = f.relative_to(REPO).as_posix()
            if checkout_rel not in NOT_SHIPPED and not _shipped(pkg, rel):
                unshipped.append(checkout_rel)
    assert not unshipped, f"not in pyproject.toml's package-data: {sorted(unshipped)}"


def test_the_dashboard_and_the_go_modules_ship() -> None:
    assert _shipped("sandman.manifests", "monitoring/sandman-dashboard.json")
    assert _shipped("sandman.hack", "kube/go.mod")
    assert _shipped("sandman.hack", "kube/go.sum")


# -- the advice for a missing module ---------------------------------------------
def _requirements() -> dict[str, set[str]]:
    """extra ("" for core) -> distribution names it lists (self-references aside)."""
    project = CONFIG["project"]
    out = {"": {Requirement(r).name.lower() for r in project["dependencies"]}}
    for extra, reqs in project["optional-dependencies"].items():
        names = {Requirement(r).name.lower() for r in reqs}
        out[extra] = names - {project["name"]}
    return out


def test_module_extras_name_the_extra_that_installs_each_distribution() -> None:
    reqs = _requirements()
    for module, (dist, extra) in MODULE_EXTRAS.items():
        assert dist.lower() in reqs[extra], f"{module}: [{extra}] does not list {dist}"


def test_every_declared_dependency_has_its_module_named() -> None:
    # Distributions whose modules no command imports by their own name.
    indirect = {"opentelemetry-exporter-otlp-proto-http", "pytest-asyncio", "ruff"}
    declared = set().union(*_requirements().values()) - indirect
    named = {dist.lower() for dist, _extra in MODULE_EXTRAS.values()}
    assert declared <= named, f"not in MODULE_EXTRAS: {sorted(declared - named)}"


@pytest.mark.parametrize(
    ("missing", "says", "never"),
    [
        # Part of the package: no extra can add it, so none is suggested.
        ("sandman.harness.cli", "installed without its own module", "pip install 'sandman-k8s["),
        ("prometheus_client", "pip install 'sandman-k8s[server]'", "[dev]"),
        ("opentelemetry.sdk.trace", "pip install 'sandman-k8s[otel]'", "[dev]"),
        ("yaml", "PyYAML (module yaml), a dependency of sandman-k8s", "["),
        ("somethingelse", "needs the Python module somethingelse", "pip install"),
    ],
)
def test_missing_module_advice(missing: str, says: str, never: str) -> None:
    text = missing_module_advice("sandman.harness.cli.image", missing)
    assert says in text
    assert never not in text


FAKE_COMMAND = """
def add_parser(sub):
    p = sub.add_parser("{name}")
    p.set_defaults(func=run)
    if {at_register}:
        raise ModuleNotFoundError("No module named 'gymnasium'", name="gymnasium")


def run(args):
    raise ModuleNotFoundError("No module named 'matplotlib'", name="matplotlib")
"""


@pytest.mark.parametrize(("at_register", "extra"), [(True, "gym"), (False, "plot")])
def test_a_dependency_missing_later_gets_the_same_advice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at_register: bool, extra: str
) -> None:
    """`sandman bench` imports its benchmarks while it registers them, and a
    command may import a dependency only when it runs: both get the advice."""
    from sandman.cli import main as cli_main

    module = f"h1_fake_command_{extra}"
    (tmp_path / f"{module}.py").write_text(
        FAKE_COMMAND.format(name="fake", at_register=at_register)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli_main.COMMANDS, "fake", (module, "a test command"))
    with pytest.raises(SystemExit) as e:
        cli_main.main(["fake"])
    assert f"pip install 'sandman-k8s[{extra}]'" in str(e.value.code)
