"""Reference normalisation: the spellings a pod and a kubelet use for one image."""

from __future__ import annotations

import pytest

from sandman.extender.refs import InvalidReference, parse, try_parse

D = "sha256:" + "ab" * 32
D2 = "sha256:" + "cd" * 32


@pytest.mark.parametrize(
    ("ref", "key"),
    [
        # Short names on Docker Hub (pure normalisation: nothing is pulled here).
        ("nginx", "docker.io/library/nginx:latest"),
        ("nginx:latest", "docker.io/library/nginx:latest"),
        ("nginx:1.25", "docker.io/library/nginx:1.25"),
        ("library/nginx", "docker.io/library/nginx:latest"),
        ("docker.io/nginx", "docker.io/library/nginx:latest"),
        ("docker.io/library/nginx:latest", "docker.io/library/nginx:latest"),
        ("index.docker.io/library/nginx", "docker.io/library/nginx:latest"),
        ("someuser/tool:2", "docker.io/someuser/tool:2"),
        # Registries with ports: the port is never read as a tag.
        ("127.0.0.1:5000/swe/task", "127.0.0.1:5000/swe/task:latest"),
        ("127.0.0.1:5000/swe/task:v1", "127.0.0.1:5000/swe/task:v1"),
        ("localhost:5000/a", "localhost:5000/a:latest"),
        ("localhost/a", "localhost/a:latest"),
        ("registry.example.com/team/img:1.0-rc.1", "registry.example.com/team/img:1.0-rc.1"),
        ("[::1]:5000/a:b", "[::1]:5000/a:b"),
        # An uppercase first component is a registry (distribution's rule).
        ("Registry/a", "Registry/a:latest"),
        # Digests name the content: the tag no longer matters.
        (f"127.0.0.1:5000/swe/task@{D}", f"127.0.0.1:5000/swe/task@{D}"),
        (f"127.0.0.1:5000/swe/task:v1@{D}", f"127.0.0.1:5000/swe/task@{D}"),
        (f"nginx@{D}", f"docker.io/library/nginx@{D}"),
        # containerStatuses[].imageID from docker-based runtimes.
        (f"docker-pullable://nginx@{D}", f"docker.io/library/nginx@{D}"),
    ],
)
def test_normalised_key(ref: str, key: str) -> None:
    assert parse(ref).key == key


def test_spellings_of_one_image_are_equal() -> None:
    spellings = ["nginx", "nginx:latest", "docker.io/library/nginx:latest", "library/nginx"]
    assert len({parse(s).key for s in spellings}) == 1


def test_ident_is_the_content_when_a_digest_is_known() -> None:
    assert parse(f"127.0.0.1:5000/a@{D}").ident == f"@{D}"
    assert parse(f"127.0.0.1:5000/b:v2@{D}").content_key == f"@{D}"
    assert parse("127.0.0.1:5000/a:v1").ident == "127.0.0.1:5000/a:v1"
    assert parse("127.0.0.1:5000/a:v1").content_key is None


@pytest.mark.parametrize(
    "ref",
    [
        "",
        "UPPER/Case",  # repository paths are lowercase
        "a/B",
        "nginx:",
        "nginx:bad tag",
        "nginx@sha256:short",
        "ab" * 32,  # a bare image ID, not a reference
        D,
        "/nginx",
        "nginx//x",
    ],
)
def test_invalid_references(ref: str) -> None:
    with pytest.raises(InvalidReference):
        parse(ref)
    assert try_parse(ref) is None


def test_try_parse_of_nothing() -> None:
    assert try_parse(None) is None
    assert try_parse(D2) is None
