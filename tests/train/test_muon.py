"""train.optim.type=muon: which parameters Muon trains and which AdamW, the Newton-Schulz FLOPs in the
budget and MFU, a clear error on a torch without Muon, bitwise resume, and DDP / FSDP2 against one
process."""

import json
import shutil
import sys

import pytest
import torch
from safetensors.torch import load_file
from torch.utils.flop_counter import FlopCounterMode

from cramlm.config.registry import config_class
from cramlm.train.budget import Budget, BudgetConfig, Costs, Meter
from cramlm.train.checkpoint import check_newton_schulz
from cramlm.train.hardware import PrecisionChoice
from cramlm.train.optim import (
    MuonAdamW,
    adjusted_lr,
    build_optimizer,
    newton_schulz,
    newton_schulz_flops,
    optimizer_flops_per_step,
    resolve_optimizer,
)
from tests.models.helpers import random_ids, tiny_model

from .helpers import CAUSAL, REPO, free_port, losses, overrides, records, run, run_inprocess

MUON = ["train.optim={type: muon, lr: 3e-3, adamw_lr: 1e-3}"]  # a mapping: another type's keys do not carry over


def muon(**fields):
    return config_class("optimizer", "muon")(type="muon", **fields)


def names_of(model, group) -> set[str]:
    by_id = {id(p): n for n, p in model.named_parameters()}
    return {by_id[id(p)] for p in group["params"]}


@pytest.mark.parametrize("arch", ["gpt2-tiny", "crammed-bert-tiny", "llama-tiny"])
def test_muon_takes_the_hidden_matrices_and_adamw_the_rest(arch):
    model = tiny_model(arch)
    opt = build_optimizer(muon(lr=0.02, adamw_lr=3e-3, weight_decay=0.1), model)
    assert isinstance(opt, MuonAdamW)
    hidden, decay, no_decay = opt.param_groups
    blocks = {f"trunk.blocks.{i}.{m}.weight" for i in range(2) for m in ("attn.qkv", "attn.out", "ffn.up", "ffn.down")}
    if arch == "crammed-bert-tiny" and model.cfg.head_transform:
        blocks.add("head.dense.weight")
    assert names_of(model, hidden) == blocks and hidden["muon"] and hidden["weight_decay"] == 0.1
    assert opt.muon.param_groups == [hidden] and opt.adamw.param_groups == [decay, no_decay]
    # embeddings and the head (tied or not) on AdamW with decay; norms, biases, scalars without
    head = {"lm_head.weight"} if arch == "llama-tiny" else set()
    tables = {"trunk.positions.table"} if arch == "gpt2-tiny" else set()
    assert names_of(model, decay) == {"trunk.tokens.weight"} | head | tables and decay["weight_decay"] == 0.1
    assert all(p.ndim < 2 for p in no_decay["params"]) and no_decay["weight_decay"] == 0.0
    assert len(no_decay["params"]) > 0
    every = {id(p) for p in model.parameters()}
    assert {id(p) for g in opt.param_groups for p in g["params"]} == every  # each parameter exactly once
    assert sum(len(g["params"]) for g in opt.param_groups) == len(every)
    assert [g["peak_lr"] for g in opt.param_groups] == [0.02, 3e-3, 3e-3]
    assert opt.muon.defaults["adjust_lr_fn"] == "match_rms_adamw"


def test_newton_schulz_flops_are_what_torch_runs():
    assert newton_schulz_flops((64, 64), 5) == 30 * 64**3  # the square case: 5 x (2 + 2 + 2) n^3
    assert newton_schulz_flops((96, 32), 5) == newton_schulz_flops((32, 96), 5) == 5 * (4 * 32 * 32 * 96 + 2 * 32**3)
    model = tiny_model("gpt2-tiny").train()
    for steps in (5, 2):
        opt = build_optimizer(muon(ns_steps=steps), model)
        ids = random_ids()
        model(ids, labels=ids)["loss"].backward()
        with FlopCounterMode(display=False) as counter:
            opt.step()
        expected = sum(newton_schulz_flops(tuple(p.shape), steps) for p in opt.param_groups[0]["params"])
        assert counter.get_total_flops() == optimizer_flops_per_step(opt) == expected > 0
        opt.zero_grad()
    assert optimizer_flops_per_step(build_optimizer(config_class("optimizer", "adamw")(type="adamw"), model)) == 0.0


def test_the_budget_and_mfu_count_the_optimizer_flops():
    costs = Costs(flops_per_token=100.0, flops_source="test", peak=1e6, peak_source="test", optimizer_flops_per_step=5000.0)
    meter = Meter(Budget(BudgetConfig(flops=30000), None, 100.0), costs)
    meter.record(tokens=100, step_seconds=1.0, agreed_seconds=1.0)
    assert meter.used.flops == 100 * 100 + 5000
    assert meter.t == pytest.approx(15000 / 30000)
    meter.record(tokens=100, step_seconds=1.0, agreed_seconds=2.0)  # (the first step is not timed)
    assert meter.mfu(meter.tokens_per_second, meter.steps_per_second) == pytest.approx((100 * 100 + 5000) / 1e6)
    assert meter.mfu(100.0) == pytest.approx(100 * 100 / 1e6)  # without the step rate: the model's share only
    assert meter.used.flops == 30000 and meter.budget.remaining_tokens(meter.used, None, 2, 5000.0) == 0.0  # spent
    meter = Meter(Budget(BudgetConfig(flops=1e6), None, 100.0), costs)  # tokens left for 10 more steps:
    assert meter.budget.remaining_tokens(meter.used, None, 10, 5000.0) == pytest.approx((1e6 - 10 * 5000) / 100)


def test_type_muon_on_the_command_line_starts_from_muons_defaults():
    """A component type change on the command line starts from the new type's defaults (issue 20
    item 11), keeping keys set earlier on the same command line; Muon's betas and eps equal bert-o4's."""
    from cramlm.cli.common import resolve_or_exit

    cfg = resolve_or_exit("pretrain", ["train=bert-o4", "train.optim.lr=2e-3", "train.optim.type=muon"])
    optim = cfg.train.optim
    assert optim.type == "muon" and optim.lr == 2e-3 and optim.adamw_lr is None  # set before the switch: kept
    assert optim.betas == (0.9, 0.98) and optim.eps == 1e-12 and optim.weight_decay == 0.1  # Muon's defaults
    assert optim.adjust_lr_fn == "match_rms_adamw" and optim.momentum == 0.95 and optim.ns_steps == 5


def test_a_torch_without_muon_is_a_clear_error(monkeypatch):
    monkeypatch.delattr(torch.optim, "Muon")
    with pytest.raises(ValueError, match=r"train.optim.type=muon needs torch >= 2.9 .*this is torch"):
        build_optimizer(muon(), tiny_model("gpt2-tiny"))


STEPS = ["budget=null", "train.budget.steps=4", "train.checkpoint_every=2", "train.keep_checkpoints=5", *MUON]


def test_muon_run_counts_its_flops_and_resumes_bitwise(tmp_path):
    ref = run_inprocess(tmp_path, "ref", *STEPS)
    adamw = run_inprocess(tmp_path, "adamw", *STEPS[:-1])
    assert ref["steps"] == adamw["steps"] == 4
    assert ref["optimizer_flops_per_step"] > 0 and adamw["optimizer_flops_per_step"] == 0
    assert ref["flops"] == pytest.approx(ref["tokens"] * ref["flops_per_token"] + 4 * ref["optimizer_flops_per_step"])
    assert adamw["flops"] == pytest.approx(adamw["tokens"] * adamw["flops_per_token"])
    assert losses(tmp_path / "ref")[4] != losses(tmp_path / "adamw")[4]  # a different optimizer ran
    # resume from step 2: the same weights, bit for bit, and the same losses
    shutil.copytree(tmp_path / "ref" / "checkpoints" / "step-00000002", tmp_path / "resumed" / "checkpoints" / "step-00000002")
    resumed = run_inprocess(tmp_path, "resumed", *STEPS, "resume=auto")
    assert resumed["steps"] == 4
    a, b = load_file(str(tmp_path / "ref" / "model.safetensors")), load_file(str(tmp_path / "resumed" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert losses(tmp_path / "resumed") == {s: v for s, v in losses(tmp_path / "ref").items() if s > 2}
    state = torch.load(tmp_path / "ref" / "checkpoints" / "step-00000004" / "training.pt", weights_only=False)
    groups = state["optimizer"]["param_groups"]
    assert [g["muon"] for g in groups] == [True, False, False] and [g["peak_lr"] for g in groups] == [3e-3, 1e-3, 1e-3]
    assert any("momentum_buffer" in s for s in state["optimizer"]["state"].values())  # Muon's state is saved
    assert any("exp_avg" in s for s in state["optimizer"]["state"].values())  # and AdamW's


def test_muon_flop_budget_stops_before_adamw(tmp_path):
    """At an equal FLOP budget, Muon's Newton-Schulz FLOPs leave fewer tokens than AdamW gets."""
    budget = ["budget=null", "train.budget.flops=4e8", "train.validate_every=0", "train.batch_ramp=0"]
    m = run_inprocess(tmp_path, "m", *budget, *MUON)
    a = run_inprocess(tmp_path, "a", *budget)
    assert m["tokens"] < a["tokens"] and m["steps"] < a["steps"]
    assert m["flops"] >= 4e8 and m["flops"] - m["optimizer_flops_per_step"] - m["flops_per_token"] * 256 < 4e8


@pytest.mark.parametrize("ns_dtype", ["bfloat16", "float32"])  # torch's update, and cramlm's on FSDP2's DTensor shards
def test_muon_under_ddp_and_fsdp_matches_one_process(tmp_path, ns_dtype):
    setup = ["budget=null", "train.budget.steps=3", "impl.microbatch_size=2", "train.validate_every=0", *MUON, *CAUSAL,
             f"train.optim.ns_dtype={ns_dtype}"]
    run_inprocess(tmp_path, "one", *setup)
    runs = [overrides(tmp_path, "ddp", *setup, "impl.distributed=ddp"),
            overrides(tmp_path, "fsdp", *setup, "impl.distributed=fsdp")]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
           str(REPO / "tests" / "train" / "dist_driver.py"), json.dumps(runs)]
    run(cmd, timeout=300)
    reference = losses(tmp_path / "one")
    assert sorted(reference) == [1, 2, 3] and abs(reference[3] - reference[1]) > 1e-3  # it moved: 1e-4 tells
    for name in ("ddp", "fsdp"):
        got = losses(tmp_path / name)
        assert sorted(got) == [1, 2, 3] and all(abs(got[s] - reference[s]) < 1e-4 for s in reference), (name, got, reference)
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        assert summary["world_size"] == 2
        assert summary["optimizer_flops_per_step"] == json.loads((tmp_path / "one" / "summary.json").read_text())["optimizer_flops_per_step"]
    assert records(tmp_path / "fsdp", "train")


@pytest.mark.parametrize("arch", ["crammed-bert-tiny", "llama-tiny"])
def test_split_fused_orthogonalises_each_block_as_its_own_matrix(arch):
    """split_fused: q, k, v (and a gated FFN's gate and value) each get torch's Muon update as if they
    were separate parameters, bit for bit; the Newton-Schulz FLOPs are counted per block."""
    torch.manual_seed(0)
    model = tiny_model(arch).train()
    opt = build_optimizer(muon(lr=0.02, split_fused=True), model)
    hidden = opt.param_groups[0]
    by_name = dict(zip(sorted(names_of(model, hidden)), [None] * len(hidden["params"])))
    names = {id(p): n for n, p in model.named_parameters()}
    rows = {names[id(p)]: r for p, r in zip(hidden["params"], hidden["rows"])}
    assert rows.keys() == by_name.keys()
    attn = model.trunk.blocks[0].attn
    D = attn.head_dim
    assert rows["trunk.blocks.0.attn.qkv.weight"] == [attn.num_heads * D, attn.num_kv_heads * D, attn.num_kv_heads * D]
    gated = model.trunk.blocks[0].ffn.gated
    inner = model.trunk.blocks[0].ffn.up.out_features
    assert rows["trunk.blocks.0.ffn.up.weight"] == ([inner // 2] * 2 if gated else None)
    assert rows["trunk.blocks.0.attn.out.weight"] is None
    # the reference: plain torch Muon on every block as a parameter of its own
    ids = random_ids()
    model(ids, labels=ids)["loss"].backward()
    ref_params = []
    for p, r in zip(hidden["params"], hidden["rows"]):
        for block, grad in zip(p.detach().split(r or [p.shape[0]]), p.grad.split(r or [p.shape[0]])):
            q = torch.nn.Parameter(block.clone())
            q.grad = grad.clone()
            ref_params.append(q)
    ref = torch.optim.Muon(ref_params, lr=0.02, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    with FlopCounterMode(display=False) as counter:
        opt.step()
    ref.step()
    got = [b for p, r in zip(hidden["params"], hidden["rows"]) for b in p.detach().split(r or [p.shape[0]])]
    assert len(got) == len(ref_params) > len(hidden["params"])
    assert all(torch.equal(a, b) for a, b in zip(got, ref_params))
    expected = sum(newton_schulz_flops(tuple(q.shape), 5) for q in ref_params)
    assert counter.get_total_flops() == optimizer_flops_per_step(opt) == expected
    assert expected != optimizer_flops_per_step(build_optimizer(muon(lr=0.02), model))
    # the momentum buffer stays one tensor per weight (a checkpoint is keyed as before)
    assert all(opt.state[p]["momentum_buffer"].shape == p.shape for p in hidden["params"])


def test_split_fused_resumes_bitwise(tmp_path):
    split = [*STEPS, "train.optim.split_fused=true"]
    run_inprocess(tmp_path, "ref", *split)
    run_inprocess(tmp_path, "whole", *STEPS)
    assert losses(tmp_path / "ref")[4] != losses(tmp_path / "whole")[4]  # the split changed the updates
    shutil.copytree(tmp_path / "ref" / "checkpoints" / "step-00000002", tmp_path / "resumed" / "checkpoints" / "step-00000002")
    run_inprocess(tmp_path, "resumed", *split, "resume=auto")
    a, b = load_file(str(tmp_path / "ref" / "model.safetensors")), load_file(str(tmp_path / "resumed" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert losses(tmp_path / "resumed") == {s: v for s, v in losses(tmp_path / "ref").items() if s > 2}


@pytest.mark.parametrize("shape", [(48, 48), (96, 32), (32, 96)])
def test_newton_schulz_in_bfloat16_is_torchs_and_float32_is_closer_to_float64(shape):
    from torch.optim._muon import _zeropower_via_newtonschulz

    torch.manual_seed(0)
    g, coefficients = torch.randn(shape), (3.4445, -4.7750, 2.0315)
    ours = newton_schulz(g, coefficients, 5, 1e-7, torch.bfloat16)
    assert ours.dtype == torch.bfloat16 and torch.equal(ours, _zeropower_via_newtonschulz(g, coefficients, 5, 1e-7))
    exact = newton_schulz(g.double(), coefficients, 5, 1e-7, torch.float64)
    fp32 = newton_schulz(g, coefficients, 5, 1e-7, torch.float32)
    assert fp32.dtype == torch.float32 and fp32.shape == g.shape
    assert (fp32 - exact).abs().max() < 1e-4 < (ours.double() - exact).abs().max()


@pytest.mark.parametrize("adjust_lr_fn", ["match_rms_adamw", "original", None, "none"])
def test_the_lr_adjusted_to_the_shape_is_torchs(adjust_lr_fn):
    """cramlm's float32 path scales the lr as torch's Muon does (a private function there, so cramlm keeps
    its own copy of the rule and this test keeps the two equal where torch still has it)."""
    torch_muon = pytest.importorskip("torch.optim._muon")
    for shape in [(8, 2), (2, 8), (5, 5), (96, 32, 3)]:
        assert adjusted_lr(0.02, adjust_lr_fn, shape) == torch_muon._adjust_lr(0.02, adjust_lr_fn, torch.Size(shape))


def test_ns_dtype_float32_is_torchs_muon_with_the_iteration_in_float32(monkeypatch):
    """ns_dtype=float32 runs torch's whole update (momentum, weight decay, the lr adjusted to the shape,
    split_fused's blocks) with only the Newton-Schulz iteration in float32: bit for bit torch's Muon
    with its iteration swapped for ``newton_schulz(..., float32)``, and not torch's own."""
    import torch.optim._muon as torch_muon

    torch.manual_seed(0)
    models = [tiny_model("crammed-bert-tiny").train() for _ in range(3)]
    ids = random_ids()
    models[0](ids, labels=ids)["loss"].backward()
    for other in models[1:]:
        other.load_state_dict(models[0].state_dict())
        for p, q in zip(models[0].parameters(), other.parameters()):
            q.grad = p.grad.clone()
    ours, swapped, torchs = (build_optimizer(muon(lr=0.02, split_fused=True, ns_dtype=d), m)
                             for d, m in zip(["float32", "bfloat16", "bfloat16"], models))
    for _ in range(2):  # the second step uses the momentum buffers
        ours.step()
        torchs.step()
        with monkeypatch.context() as m:
            m.setattr(torch_muon, "_zeropower_via_newtonschulz", lambda g, c, n, e: newton_schulz(g, c, n, e, torch.float32))
            swapped.step()
    ours_, swapped_, torchs_ = (dict(m.named_parameters()) for m in models)
    assert all(torch.equal(ours_[k], swapped_[k]) for k in ours_)
    assert not torch.equal(ours_["trunk.blocks.0.attn.qkv.weight"], torchs_["trunk.blocks.0.attn.qkv.weight"])


def test_ns_dtype_auto_follows_the_precision():
    auto = muon(ns_dtype="auto")
    assert resolve_optimizer(auto, "fp32").ns_dtype == "float32"
    assert resolve_optimizer(auto, "bf16").ns_dtype == resolve_optimizer(auto, "fp16").ns_dtype == "bfloat16"
    assert resolve_optimizer(muon(ns_dtype="bfloat16"), "fp32").ns_dtype == "bfloat16"
    adamw = config_class("optimizer", "adamw")(type="adamw")
    assert resolve_optimizer(adamw, "fp32") is adamw
    with pytest.raises(ValueError, match="ns_dtype=auto is resolved by the run's precision"):
        build_optimizer(auto, tiny_model("gpt2-tiny"))


def test_a_checkpoint_from_before_ns_dtype_resumes_only_in_bfloat16(tmp_path):
    """A Muon checkpoint whose config has no ns_dtype ran its iteration in bfloat16: a resume that
    resolves it to float32 is refused naming the key, unless allowed (then it is one more change)."""
    folder = tmp_path / "step-00000002"
    folder.mkdir()
    old = {"train": {"optim": {"type": "muon", "lr": 0.02}}}
    (folder / "state.json").write_text(json.dumps({"run": {"config": old, "data": {}}}))
    fp32, bf16 = PrecisionChoice("fp32", "test", None, "config"), PrecisionChoice("bf16", "test", None, "config")
    assert check_newton_schulz(folder, muon(), fp32, [], {}) == {}
    assert check_newton_schulz(folder, muon(ns_dtype="auto"), bf16, [], {}) == {}
    with pytest.raises(ValueError, match=r"ran the Newton-Schulz iteration in bfloat16 .*--allow-change train.optim.ns_dtype"):
        check_newton_schulz(folder, muon(ns_dtype="auto"), fp32, [], {})
    allowed = check_newton_schulz(folder, muon(ns_dtype="float32"), bf16, ["train.optim.ns_dtype"], {"x": [1, 2]})
    assert allowed == {"x": [1, 2], "train.optim.ns_dtype": ["bfloat16", "float32"]}


def test_ns_dtype_is_compared_as_each_side_resolves_it(tmp_path):
    """A checkpoint that has the key: its dtype as resolved with its own precision against this
    run's, so a recipe that moves from bfloat16 to auto resumes where auto means bfloat16, and is
    refused, naming both dtypes, where it does not."""
    folder = tmp_path / "step-00000002"
    folder.mkdir()
    fp32, bf16 = PrecisionChoice("fp32", "test", None, "config"), PrecisionChoice("bf16", "test", None, "config")

    def written(ns_dtype, precision):
        run = {"config": {"train": {"optim": {"type": "muon", "lr": 0.02, "ns_dtype": ns_dtype}}}, "data": {}}
        (folder / "state.json").write_text(json.dumps({"run": run, "precision": precision}))

    written("bfloat16", "bf16")
    assert check_newton_schulz(folder, muon(ns_dtype="auto"), bf16, [], {}) == {}
    written("bfloat16", "fp32")
    with pytest.raises(ValueError, match=r"train.optim.ns_dtype bfloat16 -> float32 \(the run's bfloat16, this run's auto"):
        check_newton_schulz(folder, muon(ns_dtype="auto"), fp32, [], {})
    assert check_newton_schulz(folder, muon(ns_dtype="auto"), fp32, ["train.optim.ns_dtype"], {}) == {
        "train.optim.ns_dtype": ["bfloat16", "float32"]}
    written("auto", "fp32")
    assert check_newton_schulz(folder, muon(ns_dtype="float32"), fp32, [], {}) == {}
    with pytest.raises(ValueError, match=r"train.optim.ns_dtype float32 -> bfloat16"):
        check_newton_schulz(folder, muon(), fp32, [], {})
    written("auto", "bf16")  # auto on both sides follows an allowed precision change, and only an allowed one
    with pytest.raises(ValueError, match=r"train.optim.ns_dtype bfloat16 -> float32"):
        check_newton_schulz(folder, muon(ns_dtype="auto"), fp32, [], {})
    assert check_newton_schulz(folder, muon(ns_dtype="auto"), fp32, ["impl.precision"], {}) == {
        "train.optim.ns_dtype": ["bfloat16", "float32"]}
    written("float32", "fp32")  # another optimizer now: nothing to compare
    assert check_newton_schulz(folder, config_class("optimizer", "adamw")(type="adamw"), fp32, [], {}) == {}


def test_ns_dtype_float32_run_resumes_bitwise_and_changes_the_run(tmp_path):
    fp32 = [*STEPS, "train.optim.ns_dtype=float32"]
    run_inprocess(tmp_path, "ref", *fp32)
    run_inprocess(tmp_path, "bf16", *STEPS)
    assert losses(tmp_path / "ref")[4] != losses(tmp_path / "bf16")[4]  # the iteration's dtype reached the updates
    shutil.copytree(tmp_path / "ref" / "checkpoints" / "step-00000002", tmp_path / "resumed" / "checkpoints" / "step-00000002")
    run_inprocess(tmp_path, "resumed", *fp32, "resume=auto")
    a, b = load_file(str(tmp_path / "ref" / "model.safetensors")), load_file(str(tmp_path / "resumed" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(Exception, match=r"train.optim.ns_dtype float32 -> bfloat16"):
        shutil.copytree(tmp_path / "ref" / "checkpoints" / "step-00000002", tmp_path / "again" / "checkpoints" / "step-00000002")
        run_inprocess(tmp_path, "again", *STEPS, "resume=auto")


def test_ns_dtype_auto_says_what_it_resolved_to(tmp_path, capsys):
    run_inprocess(tmp_path, "auto", *STEPS, "train.optim.ns_dtype=auto", "impl.precision=fp32")
    assert "Muon's Newton-Schulz iteration in float32 (train.optim.ns_dtype=auto)" in capsys.readouterr().out
    run_inprocess(tmp_path, "fixed", *STEPS, "train.optim.ns_dtype=float32", "impl.precision=fp32")
    assert "Newton-Schulz" not in capsys.readouterr().out  # a dtype given as such is in the config, not the banner
