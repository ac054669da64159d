"""`cramlm export hf` on a real (tiny) pretraining run."""

from __future__ import annotations

import json
import os

import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open

from cramlm.cli import main
from cramlm.run.build import load_run
from tests.conftest import TINY_PRETRAIN

transformers = pytest.importorskip("transformers")


def test_export_hf_of_a_run_loads_in_transformers(in_tmp):
    runner = CliRunner()
    result = runner.invoke(main, ["pretrain", "arch=bert-original-tiny", "name=tiny", "dryrun=true", *TINY_PRETRAIN])
    assert result.exit_code == 0, result.output
    result = runner.invoke(main, ["export", "hf", "tiny", "hf-out"])  # a run name under ./outputs
    assert result.exit_code == 0, result.output
    assert "BertForMaskedLM" in result.output
    # every class it serves, and a model card saying what it is and how to load it
    assert "also: AutoModel, AutoModelForSequenceClassification, AutoModelForTokenClassification" in result.output
    card = (in_tmp / "hf-out" / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: transformers\ntags: [cramlm, mlm]") and "AutoModelForMaskedLM" in card
    ours, tok, _ = load_run(in_tmp / "outputs" / "tiny")
    hf = transformers.AutoModelForMaskedLM.from_pretrained(in_tmp / "hf-out").eval()
    auto_tok = transformers.AutoTokenizer.from_pretrained(in_tmp / "hf-out")
    text = "call me ishmael, said the whale"
    ids = auto_tok(text, return_tensors="pt")["input_ids"]
    assert ids[0].tolist() == tok.encode(text).ids
    ours.eval()
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=ids).logits, ours(ids)["logits"], rtol=1e-4, atol=1e-4)
        # a sentence pair: the tokenizer gives segment 1 after the first [SEP], which the run never
        # trained (it computes every token in segment 0): the export computes what the run computes
        pair = auto_tok("call me ishmael", "said the whale", return_token_type_ids=True, return_tensors="pt")
        assert pair["token_type_ids"].max() == 1
        assert ours.trunk.token_types.weight[1].ne(ours.trunk.token_types.weight[0]).any()  # an untrained row
        torch.testing.assert_close(hf(**pair).logits, ours(pair["input_ids"])["logits"], rtol=1e-4, atol=1e-4)


def test_an_export_replaces_its_own_files_and_never_a_run_or_other_files(in_tmp, monkeypatch):
    """An export is written whole before anything of its folder changes (a failure half-way leaves
    the earlier export); in an existing folder it replaces its own entries and an earlier export's
    that it no longer writes, and leaves the rest (a clone's .git, the user's files; was: the whole
    folder replaced, .git deleted); a symlinked output folder stays a link to the export."""
    import json
    runner = CliRunner()
    assert runner.invoke(main, ["pretrain", "arch=bert-original-tiny", "name=tiny", "dryrun=true", *TINY_PRETRAIN]).exit_code == 0
    run = in_tmp / "outputs" / "tiny"
    before = (run / "model.safetensors").read_bytes()
    for target in ("outputs/tiny", "outputs"):  # the run itself, or a folder holding it
        result = runner.invoke(main, ["export", "hf", "tiny", target])
        assert result.exit_code == 1 and "would replace the run folder" in result.output, result.output
    (in_tmp / "mine").mkdir()
    (in_tmp / "mine" / "notes.txt").write_text("not an export")
    result = runner.invoke(main, ["export", "hf", "tiny", "mine"])
    assert result.exit_code == 1 and "holds other files (notes.txt) and no config.json" in result.output
    assert (run / "model.safetensors").read_bytes() == before and (in_tmp / "mine" / "notes.txt").is_file()
    (in_tmp / "hf-out" / ".git").mkdir(parents=True)  # a clone of an empty Hugging Face repository: hidden entries alone
    (in_tmp / "hf-out" / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    assert runner.invoke(main, ["export", "hf", "tiny", "hf-out"]).exit_code == 0
    (in_tmp / "hf-out" / "modeling_cramlm.py").write_text("# a leftover of an earlier (remote-code) export")
    recorded = in_tmp / "hf-out" / ".cramlm-export.json"
    entries = json.loads(recorded.read_text())["entries"]
    assert "config.json" in entries and ".git" not in entries
    recorded.write_text(json.dumps({"entries": [*entries, "modeling_cramlm.py"]}))
    (in_tmp / "hf-out" / "notes.md").write_text("the user's own")
    import cramlm.models.hf as hf_module  # a failure half-way (disk full while writing the weights)

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device", str(in_tmp / "hf-out" / "model.safetensors"))

    with monkeypatch.context() as patched:
        patched.setattr(hf_module, "save_safetensors", fail)
        result = runner.invoke(main, ["export", "hf", "tiny", "hf-out"])
    assert result.exit_code == 1 and "disk full" in result.output, result.output
    from safetensors import SafetensorError

    def full(*args, **kwargs):  # as safetensors says it: its own error, no file named
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    with monkeypatch.context() as patched:
        patched.setattr(hf_module, "save_safetensors", full)
        result = runner.invoke(main, ["export", "hf", "tiny", "hf-out"])
    assert result.exit_code == 1 and result.output.startswith("Error: hf-out: disk full while exporting tiny ("), result.output
    assert (in_tmp / "hf-out" / "modeling_cramlm.py").is_file()  # the earlier export untouched
    assert not [p for p in [*in_tmp.iterdir(), *(in_tmp / "hf-out").iterdir()] if ".tmp" in p.name]  # no half-written folder left
    assert runner.invoke(main, ["export", "hf", "tiny", "hf-out"]).exit_code == 0
    assert not (in_tmp / "hf-out" / "modeling_cramlm.py").exists()  # the earlier export's, no longer written: gone
    assert (in_tmp / "hf-out" / ".git" / "HEAD").is_file() and (in_tmp / "hf-out" / "notes.md").is_file()  # the rest stays
    # a record that is not one (tampered, another tool's) names nothing to remove: never .git, never itself
    for record in ('{"entries": 5}', '{"entries": [".git", ".cramlm-export.json", "../x"]}', "[1, 2]"):
        recorded.write_text(record)
        result = runner.invoke(main, ["export", "hf", "tiny", "hf-out"])
        assert result.exit_code == 0 and (in_tmp / "hf-out" / ".git" / "HEAD").is_file() and recorded.is_file(), result.output
    # a folder of the user's where the export writes a file: refused before anything is replaced
    config = b'{"marker": "the earlier config"}'
    (in_tmp / "hf-out" / "config.json").write_bytes(config)
    (in_tmp / "hf-out" / "tokenizer.json").unlink()
    (in_tmp / "hf-out" / "tokenizer.json").mkdir()
    recorded.write_text(json.dumps({"entries": ["config.json"]}))
    result = runner.invoke(main, ["export", "hf", "tiny", "hf-out"])
    assert result.exit_code == 1 and "tokenizer.json: a folder where the export writes a file" in result.output, result.output
    assert (in_tmp / "hf-out" / "config.json").read_bytes() == config and (in_tmp / "hf-out" / "tokenizer.json").is_dir()
    (in_tmp / "hf-out" / "tokenizer.json").rmdir()
    (in_tmp / "latest").symlink_to("hf-out")
    result = runner.invoke(main, ["export", "hf", "tiny", "latest"])
    assert result.exit_code == 0, result.output  # was: the link replaced by a folder, then an rmtree error
    assert (in_tmp / "latest").is_symlink() and not [p for p in in_tmp.iterdir() if p.name.startswith(".latest")]
    assert transformers.AutoConfig.from_pretrained(in_tmp / "latest").model_type == "bert"


def test_an_export_removes_what_a_killed_export_left_and_refuses_a_second_at_once(in_tmp):
    """A killed export (SIGKILL, a lost machine) leaves its half-written folder and assembled weights,
    each as large as the model: the next export into that folder removes them, saying so; while one
    export holds the folder a second is refused, naming the holder."""
    from tests.train.helpers import holder

    runner = CliRunner()
    assert runner.invoke(main, ["pretrain", "arch=bert-original-tiny", "name=tiny", "dryrun=true", *TINY_PRETRAIN]).exit_code == 0
    left = [in_tmp / ".new-out.tmp-4242", in_tmp / ".new-out.assembled-x1y2"]  # a new folder's, killed before its rename
    for folder in left:
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"0" * 2_000_000)
    result = runner.invoke(main, ["export", "hf", "tiny", "new-out"])
    assert result.exit_code == 0, result.output
    for folder in left:
        assert not folder.exists() and f"removed {folder} (2.0 MB), left by an export into new-out that was stopped" in result.output
    inside = in_tmp / "new-out" / ".export.tmp-4242"  # an existing folder's, killed before its entries moved in
    inside.mkdir()
    result = runner.invoke(main, ["export", "hf", "tiny", "new-out"])
    assert result.exit_code == 0 and not inside.exists(), result.output
    assert sorted(p.name for p in in_tmp.iterdir() if p.name.startswith(".new-out")) == []  # the lock file gone too
    assert not (in_tmp / ".new-out.export-lock").exists() and not (in_tmp / "new-out" / ".export.lock").exists()
    lock = in_tmp / ".new-out.export-lock"
    held = holder(lock)
    try:
        before = sorted(p.name for p in (in_tmp / "new-out").iterdir())
        result = runner.invoke(main, ["export", "hf", "tiny", "new-out"])
        assert result.exit_code == 1 and result.output.startswith(f"Error: export folder {in_tmp / 'new-out'} is in use by pid "), result.output
        assert sorted(p.name for p in (in_tmp / "new-out").iterdir()) == before
    finally:
        held.kill()
        held.wait()


def test_export_hf_of_a_missing_run_fails_cleanly(in_tmp):
    result = CliRunner().invoke(main, ["export", "hf", "nope", "out"])
    assert result.exit_code == 1 and "no such run" in result.output


GPT_RUN = ["arch=gpt2-tiny", "name=gpt", *TINY_PRETRAIN, "budget=null", "train.budget.steps=40", "train.optim.lr=3e-3",
           "train.batch_ramp=0", "data.tokenizer.vocab_size=400"]


def test_a_gpt_run_exports_a_model_that_generates_clean_text(in_tmp):
    """Causal LMs train on a byte-level BPE with <|endoftext|> between documents (not the masked LMs'
    lowercasing WordPiece and [CLS] template), and the export generates text and stops at eos."""
    runner = CliRunner()
    result = runner.invoke(main, ["pretrain", *GPT_RUN])
    assert result.exit_code == 0, result.output
    _, tok, cfg = load_run(in_tmp / "outputs" / "gpt")
    assert (cfg.data.tokenizer.kind, cfg.data.tokenizer.template, cfg.data.tokenizer.lowercase) == ("byte-bpe", "none", False)
    result = runner.invoke(main, ["export", "hf", "gpt", "hf-gpt"])
    assert result.exit_code == 0, result.output
    assert "GPT2LMHeadModel" in result.output and "text-generation" in result.output

    folder = in_tmp / "hf-gpt"
    auto_tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    eot = auto_tok.convert_tokens_to_ids("<|endoftext|>")
    assert eot == tok.token_to_id("<|endoftext|>") == 5  # after [PAD] [UNK] [CLS] [SEP] [MASK]
    assert auto_tok.eos_token_id == auto_tok.bos_token_id == auto_tok.pad_token_id == eot
    generation = json.loads((folder / "generation_config.json").read_text())
    assert generation["eos_token_id"] == generation["pad_token_id"] == eot
    assert model.generation_config.eos_token_id == eot

    text = "Call me Ishmael.  Some years ago--never mind how long precisely"
    ids = auto_tok(text)["input_ids"]
    assert auto_tok.decode(ids) == text  # capitals and spacing survive; no [CLS]/[SEP] added
    assert tok.token_to_id("[CLS]") not in ids and tok.token_to_id("[SEP]") not in ids

    prompt = auto_tok("Call me Ishmael.", return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=20, do_sample=False)
    decoded = auto_tok.decode(out[0])
    assert decoded.startswith("Call me Ishmael.") and len(out[0]) > prompt["input_ids"].shape[1]
    assert not any(junk in decoded for junk in ("[CLS]", "[SEP]", "[PAD]", "##"))
    # it stops at eos: forcing eos as the next token ends the generation there
    with torch.no_grad():
        stopped = model.generate(**prompt, max_new_tokens=20, do_sample=False, sequence_bias={(eot,): 100.0})
    assert stopped[0].tolist() == [*prompt["input_ids"][0].tolist(), eot]

    generator = transformers.pipeline("text-generation", model=model, tokenizer=auto_tok)
    piece = generator("The whale", max_new_tokens=12, do_sample=False)[0]["generated_text"]
    assert piece.startswith("The whale") and not any(junk in piece for junk in ("[CLS]", "[SEP]", "##"))


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_export_is_readable_like_any_file_and_stores_the_tied_embedding_once(in_tmp):
    runner = CliRunner()
    result = runner.invoke(main, ["pretrain", "name=tiny", "dryrun=true", *TINY_PRETRAIN])  # crammed-bert: remote code
    assert result.exit_code == 0, result.output
    result = runner.invoke(main, ["export", "hf", "tiny", "hf-out"])
    assert result.exit_code == 0, result.output
    assert "trust_remote_code=True" in result.output
    run, out = in_tmp / "outputs" / "tiny", in_tmp / "hf-out"
    expected = 0o666 & ~_umask()
    files = [*out.iterdir(), *run.glob("checkpoints/*/*.safetensors"), run / "model.safetensors"]
    assert {f.name: oct(f.stat().st_mode & 0o777) for f in files} == {f.name: oct(expected) for f in files}  # not 0600
    with safe_open(out / "model.safetensors", "pt") as f:
        assert "trunk.tokens.weight" in f.keys() and "head.decoder.weight" not in f.keys()
    assert (out / "model.safetensors").stat().st_size <= (run / "model.safetensors").stat().st_size + 4096
    ours, _, _ = load_run(run)
    hf = transformers.AutoModelForMaskedLM.from_pretrained(out, trust_remote_code=True).eval()
    assert hf.head.decoder.weight is hf.trunk.tokens.weight  # tied again on loading
    ids = torch.randint(5, 500, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=ids).logits, ours.eval()(ids)["logits"], rtol=1e-5, atol=1e-5)


def test_a_checkpoint_of_a_run_that_never_finished_exports(in_tmp):
    """A run killed (or still training) has checkpoints but no final model.safetensors: its newest
    checkpoint exports as the weights it holds (was: refused for want of the final weights)."""
    runner = CliRunner()
    result = runner.invoke(main, ["pretrain", "arch=bert-original-tiny", "name=cut", *TINY_PRETRAIN, "budget=null",
                                  "train.budget.steps=4", "train.checkpoint_every=2"])
    assert result.exit_code == 0, result.output
    run = in_tmp / "outputs" / "cut"
    (run / "model.safetensors").unlink()  # as if killed before its end
    (run / "summary.json").unlink()
    result = runner.invoke(main, ["export", "hf", str(run / "checkpoints" / "step-00000002"), "hf-cut"])
    assert result.exit_code == 0, result.output
    with safe_open(run / "checkpoints" / "step-00000002" / "model.safetensors", "pt") as ours, \
            safe_open(in_tmp / "hf-cut" / "model.safetensors", "pt") as theirs:
        assert torch.equal(ours.get_tensor("trunk.tokens.weight"), theirs.get_tensor("bert.embeddings.word_embeddings.weight"))


def test_every_remote_code_exports_load_lines_name_the_tokenizer_with_trust_remote_code():
    """Without trust_remote_code, AutoTokenizer on a remote-code export stops at an interactive
    prompt: every objective whose export is remote code says how to load its tokenizer, on a line of its own."""
    from cramlm.models.objectives.base import build_objective
    from cramlm.pipeline.recipe import resolve_recipe

    for objective in ("mlm", "hybrid", "rtd"):
        cfg = resolve_recipe("default", [f"train.objective={objective}"]).pretrain_config()
        lines = build_objective(cfg).load_lines("out", "CramlmForMaskedLM")
        assert "tokenizer: transformers.AutoTokenizer.from_pretrained('out', trust_remote_code=True)" in lines, (objective, lines)
    plain = build_objective(resolve_recipe("default", ["train.objective=mlm"]).pretrain_config()).load_lines("out", "BertForMaskedLM")
    assert not any("AutoTokenizer" in line for line in plain)  # a stock class: its tokenizer loads as any
