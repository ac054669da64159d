"""The machinery of benchmarks/adversarial.py (the whole replay is a benchmark, not a test)."""

from __future__ import annotations

import importlib.util
import pickle
import sys
from pathlib import Path

import pytest

from cramlm.data.modalities import write_pbin

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "adversarial.py"


@pytest.fixture(scope="module")
def adv():
    spec = importlib.util.spec_from_file_location("cramlm_adversarial", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def test_outcomes_are_classified(adv):
    R = adv.Result
    tb = "Traceback (most recent call last):\n  File ...\nValueError: boom\n"
    assert adv.classify(R(1, "", "Error: x.jsonl:3: bad\n", 1, 1), "error", ("x.jsonl",)) == ("clear", "Error: x.jsonl:3: bad")
    assert adv.classify(R(1, "", tb, 1, 1), "error")[0] == "traceback"
    assert adv.classify(R(0, "done\n", "", 1, 1), "error")[0] == "silent"
    assert adv.classify(R(1, "", "Aborted!\n", 1, 1), "error")[0] == "unclear"
    assert adv.classify(R(1, "", "Error: something\n", 1, 1), "error", ("text_key",))[0] == "unclear"
    assert adv.classify(R(0, "{}\n", "", 1, 1), "ok") == ("ok", "{}")
    assert adv.classify(R(0, "{}\n", "", 1, 1), "ok", check=lambda r: "data lost") == ("silent", "data lost")
    assert adv.classify(R(None, "", "", 9, 1, timed_out=True), "ok")[0] == "unclear"


def test_two_cases_through_the_cli(adv, tmp_path):
    """A binary corpus and a .pbin index that runs a command, replayed against the real CLI."""
    replay = adv.Replay(tmp_path, quick=True, seed=0, verbose=False)
    (tmp_path / "binary.bin").write_bytes(bytes(range(256)) * 8)
    res = adv.cli(["data", "pack", "binary.bin", "--tokenizer", str(replay.tokenizer()), "--out", "b.cramtok"], tmp_path)
    assert replay.record("corpus", "binary", "error", res, ("binary.bin",)).outcome == "clear"
    raw = write_pbin(tmp_path / "good.pbin", [[1, 2], [3]]).read_bytes()
    marker = tmp_path / "RAN"
    (tmp_path / "evil.pbin").write_bytes(raw[: 12 + 6] + pickle.dumps(adv.Payload(f"touch {marker}")))
    res = adv.cli(["data", "convert-modalities", "evil.pbin", "e.cramtok"], tmp_path)
    assert replay.record("corrupt", "evil", "error", res, ("evil.pbin",)).outcome == "clear" and not marker.exists()
    assert "clear" in adv.table({"counts": {"corpus": {o: int(o == "clear") for o in adv.OUTCOMES}}, "cases":
                                 [adv.asdict(c) | {"expected": c.expected} for c in replay.cases[:1]],
                                 "total": {o: int(o == "clear") for o in adv.OUTCOMES}, "unexpected": 0, "skipped_classes": {}})
