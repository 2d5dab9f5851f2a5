"""The image config cache's byte budget: estimates, LRU eviction by bytes (pure)."""

from __future__ import annotations

import argparse

from sandman.oci import MAX_ARGV_WORD_BYTES, MAX_ARGV_WORDS, ImageConfig, Reference
from sandman.webhook import config as cfg
from sandman.webhook.imagecache import MAX_CONFIG_BYTES, ImageConfigCache, config_cost
from sandman.webhook.lookups import AdmissionLookups

REF = Reference.parse("r.io/a")  # name "r.io/a": a key is "r.io/a@sha256:<64>", 78 bytes


def digest(i: int) -> str:
    return f"sha256:{i:064x}"


def cache(max_config_bytes: int) -> ImageConfigCache:
    return ImageConfigCache(lambda: 0.0, max_config_bytes=max_config_bytes)


# ImageConfig(cmd=("x" * 1000,)): words "x"*1000, WorkingDir "", the 78-byte key:
# 512 (entry) + 3 * 64 (words) + 1000 + 0 + 78 = 1782
ONE_KB = ImageConfig(cmd=("x" * 1000,))
ONE_KB_COST = 1782


def test_cost_is_text_plus_overheads() -> None:
    # ("/e",) ("c",) "/w" under key "k": 4 words; 512 + 4 * 64 + (2 + 1 + 2 + 1) = 774
    assert config_cost("k", ImageConfig(("/e",), ("c",), "/w")) == 774
    assert config_cost(f"r.io/a@{digest(0)}", ONE_KB) == ONE_KB_COST
    # UTF-8 bytes, not characters: "€" is 3 bytes; 512 + 2 * 64 + 3 + 1 = 644
    assert config_cost("k", ImageConfig(cmd=None, working_dir="€")) == 644


def test_the_least_recently_used_goes_when_the_bytes_run_out() -> None:
    c = cache(3 * ONE_KB_COST)  # 5,346 bytes: three entries of 1,782
    for i in range(3):
        c.remember(REF, "anon", digest(i), ONE_KB)
    assert len(c) == 3 and c.config_bytes == 3 * ONE_KB_COST
    assert c.config_for(REF, digest(0), "anon") == ONE_KB  # 0 is now the most recent
    c.remember(REF, "anon", digest(3), ONE_KB)  # 4 * 1,782 = 7,128 > 5,346: evict 1
    assert c.config_for(REF, digest(1), "anon") is None
    assert all(c.config_for(REF, digest(i), "anon") == ONE_KB for i in (0, 2, 3))
    assert len(c) == 3 and c.config_bytes == 3 * ONE_KB_COST


def test_a_big_entry_evicts_as_many_as_its_bytes_need() -> None:
    c = cache(4 * ONE_KB_COST)  # 7,128 bytes
    for i in range(3):
        c.remember(REF, "anon", digest(i), ONE_KB)
    # 1,782 + 2,000 more text bytes = 3,782: with it, 3 * 1,782 + 3,782 = 9,128 > 7,128,
    # without 0: 7,346 > 7,128, without 1 too: 5,564 <= 7,128; so 0 and 1 go, 2 stays
    big = ImageConfig(cmd=("x" * 3000,))
    assert config_cost(f"r.io/a@{digest(9)}", big) == ONE_KB_COST + 2000
    c.remember(REF, "anon", digest(9), big)
    assert [c.config_for(REF, digest(i), "anon") for i in (0, 1)] == [None, None]
    assert c.config_for(REF, digest(2), "anon") == ONE_KB
    assert len(c) == 2 and c.config_bytes == ONE_KB_COST + 3782


def test_re_remembering_an_entry_counts_it_once() -> None:
    c = cache(10 * ONE_KB_COST)
    for _ in range(5):
        c.remember(REF, "anon", digest(0), ONE_KB)
    assert len(c) == 1 and c.config_bytes == ONE_KB_COST


def test_an_entry_over_the_whole_budget_is_not_kept() -> None:
    c = cache(ONE_KB_COST - 1)
    c.remember(REF, "anon", digest(0), ONE_KB)
    assert len(c) == 0 and c.config_bytes == 0 and c.get(REF, "anon") is None


def test_the_default_budget_holds_configs_at_every_cap() -> None:
    # The worst ImageConfig that parses: 4 words of 16 KiB (64 KiB in all) and 252
    # empty ones, WorkingDir "": 512 + 258 * 64 + 65,536 + 78 = 82,638 bytes each.
    # 16 MiB / 82,638 = 203.0...: 203 stay however many are remembered.
    worst = ImageConfig(cmd=("x" * MAX_ARGV_WORD_BYTES,) * 4 + ("",) * (MAX_ARGV_WORDS - 4))
    assert config_cost(f"r.io/a@{digest(0)}", worst) == 82_638
    c = ImageConfigCache(lambda: 0.0)
    for i in range(1000):
        c.remember(REF, f"cred-{i % 7}", digest(i), worst)
    assert MAX_CONFIG_BYTES == 16 << 20
    assert len(c) == 203 and c.config_bytes == 203 * 82_638 <= MAX_CONFIG_BYTES


def test_the_budget_is_a_webhook_flag() -> None:
    p = argparse.ArgumentParser()
    cfg.add_flags(p)
    default = cfg.from_args(p.parse_args(["--daemon-image", "r/d:1"]))
    assert default.image_cache_bytes == MAX_CONFIG_BYTES
    small = cfg.from_args(p.parse_args(["--daemon-image", "r/d:1", "--image-cache-bytes=1234"]))
    lookups = AdmissionLookups.build(small, client=None)  # type: ignore[arg-type]  # no I/O here
    assert lookups.images is not None and lookups.images.cache.max_config_bytes == 1234
