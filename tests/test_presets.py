"""The tiny presets ship built, and their weights are the ones the repository records."""

from swarmnode.model import tiny
from swarmnode.model.tiny import (
    PRESET_DIGESTS,
    SHIPPED,
    TINY_PRESETS,
    ensure_tiny,
    shipped_dir,
    weights_digest,
)


def test_every_preset_ships_with_the_weights_its_digest_records():
    assert PRESET_DIGESTS.keys() == TINY_PRESETS.keys()
    for name, spec in TINY_PRESETS.items():
        assert weights_digest(shipped_dir(spec)) == PRESET_DIGESTS[name], f"{name}: shipped weights changed"
    assert len(list(SHIPPED.iterdir())) == len(TINY_PRESETS), "a shipped build no spec names"


def test_a_shipped_preset_is_used_as_it_is_and_nothing_is_built(tmp_path, monkeypatch):
    monkeypatch.setenv("SWARMNODE_CACHE", str(tmp_path))
    monkeypatch.setattr(tiny, "build_tiny", lambda *args: (_ for _ in ()).throw(AssertionError("built")))
    assert ensure_tiny(TINY_PRESETS["tiny-large"]) == shipped_dir(TINY_PRESETS["tiny-large"])
    assert list(tmp_path.iterdir()) == []


def test_a_spec_that_ships_no_build_is_built_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SWARMNODE_CACHE", str(tmp_path))
    built = []
    monkeypatch.setattr(tiny, "build_tiny", lambda spec, directory: built.append(directory))
    spec = {**TINY_PRESETS["tiny"], "warmup_steps": 3}
    path = ensure_tiny(spec)
    assert path.parent == tmp_path and path.name == shipped_dir(spec).name and len(built) == 1
