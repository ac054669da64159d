"""A run trained on the GPU exports (`cramlm export hf`) and loads in transformers on the GPU with
our logits: a stock class (BertForMaskedLM) and a remote-code package (crammed-bert's own code)."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

from cramlm.cli import main
from cramlm.run.build import load_run
from tests.gpu.helpers import run_overrides
from tests.train.helpers import overrides

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("arch,cls", [("bert-original-tiny", "BertForMaskedLM"), ("crammed-bert-tiny", "CramlmForMaskedLM")])
def test_export_of_a_gpu_run_loads_in_transformers_on_the_gpu(arch, cls, device, tmp_path):
    runner = CliRunner()
    args = overrides(tmp_path, "gpu", f"arch={arch}", *run_overrides(device, "budget=null", "train.budget.steps=3"))
    result = runner.invoke(main, ["pretrain", *args])
    assert result.exit_code == 0, result.output
    assert f"device {device.type}" in result.output
    result = runner.invoke(main, ["export", "hf", str(tmp_path / "gpu"), str(tmp_path / "hf")])
    assert result.exit_code == 0, result.output
    assert cls in result.output
    ours, tok, _ = load_run(tmp_path / "gpu", device=device)
    ours.eval()
    hf = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "hf", trust_remote_code=cls.startswith("Cramlm"))
    hf = hf.to(device).eval()
    assert type(hf).__name__ == cls and next(hf.parameters()).device.type == device.type
    auto_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    batch = auto_tok(["call me ishmael", "the whale, the whale and the sea"], padding=True, return_tensors="pt")
    ids, mask = batch["input_ids"].to(device), batch["attention_mask"].to(device)
    assert ids[0, : mask[0].sum()].tolist() == tok.encode("call me ishmael").ids
    with torch.no_grad():
        theirs = hf(input_ids=ids, attention_mask=mask).logits
        mine = ours(ids, attention_mask=mask)["logits"]
    keep = mask.bool()
    torch.testing.assert_close(theirs[keep], mine[keep], rtol=1e-4, atol=1e-4)
