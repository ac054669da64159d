"""Preset inheritance (`extends:`) and the resolved config of every shipped preset.

``fixtures/resolved_presets.json`` holds the fully resolved config of every preset of every group
and every run recipe, taken before the presets were rewritten to extend each other: rewriting a
preset must not change what it resolves to. After an intended change to a preset, regenerate it
with ``python tests/config/test_presets.py`` and review the diff.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from cramlm.config.loader import GROUPS, ConfigError, available_presets, load_preset, resolve

SNAPSHOT = Path(__file__).parent / "fixtures" / "resolved_presets.json"
ENV = ("CRAMLM_DATA_DIR", "CRAMLM_GLUE_DIR")  # recipes interpolate these; the snapshot has their defaults


def resolved(group: str, name: str) -> dict:
    """The resolved config a preset gives: a group preset picked on the command line of the
    command that takes it (eval presets: `cramlm eval`, others: `cramlm pretrain`), a run recipe
    through `cramlm run`."""
    if group == "run":
        from cramlm.pipeline.run import resolve_recipe

        return resolve_recipe(name).model_dump(mode="json")
    if group == "eval":
        from cramlm.evaluate import DEFAULTS, EvalRunConfig

        return resolve(EvalRunConfig, DEFAULTS, [f"eval={name}"]).model_dump(mode="json")
    from cramlm.pretrain import DEFAULTS, PretrainConfig

    return resolve(PretrainConfig, DEFAULTS, [f"{group}={name}"]).model_dump(mode="json")


def all_presets() -> list[tuple[str, str]]:
    return [(group, name) for group in (*GROUPS, "run") for name in available_presets(group)]


def snapshot() -> dict[str, dict]:
    for var in ENV:
        os.environ.pop(var, None)
    return {f"{group}/{name}": resolved(group, name) for group, name in all_presets()}


# ------------------------------------------------------------------ the shipped presets


def test_snapshot_covers_every_preset():
    assert sorted(json.loads(SNAPSHOT.read_text())) == sorted(f"{g}/{n}" for g, n in all_presets())


@pytest.mark.parametrize("preset", [f"{g}/{n}" for g, n in all_presets()])
def test_preset_resolves_as_before(preset, monkeypatch):
    for var in ENV:
        monkeypatch.delenv(var, raising=False)
    expected = json.loads(SNAPSHOT.read_text())[preset]
    assert resolved(*preset.split("/")) == expected


if __name__ == "__main__":  # regenerate the snapshot
    SNAPSHOT.write_text(json.dumps(snapshot(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {SNAPSHOT}", file=sys.stderr)
