"""``cramlm run RECIPE``: raw text to an evaluated checkpoint and a report, in one command.

A run recipe (``recipes/run/<name>.yaml``, or a path to a YAML file) holds the keys of
:class:`PipelineConfig`: group keys (``arch``, ``train``, ``data``, ``impl``, ``eval``) name presets,
``overrides`` maps dotted keys to values applied after the presets, and command-line
``key=value`` overrides come last.

Stages: data -> pretrain -> eval -> eval-untrained -> report. ``eval-untrained`` fine-tunes the
run's untrained twin (same architecture and tokenizer, random weights; ``checkpoint=<run>-untrained``
in ``cramlm eval``) with the same evaluation config into ``<run>/eval-untrained.json``, so the report
and the console show what pretraining bought; ``untrained_twin=false`` skips it.

Each finished stage is recorded in ``<run>/pipeline.json`` with a key (a hash of the config it
depends on); a re-run skips a stage when its record, its key and its output files all match, and
re-runs every stage after one that ran -- except ``eval-untrained``, which does not depend on the
training: its result is reused while the architecture, data, evaluation and seed are unchanged.

``arch=auto`` (in a recipe or on the command line) lets ``cramlm plan`` choose the model shape, batch,
learning rate and masking rate for the run's budget on this machine (see pipeline/plan.py): it
measures, prints the table it chose from, and records the choice in ``<run>/plan.json``, which a
re-run with the same settings reuses (so finished stages stay finished). Explicit overrides on the
command line (``arch.hidden_size=...``) still win over the plan.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from cramlm.config.base import key_dump
from cramlm.config.loader import available_presets, load_preset, load_yaml, preset_path, resolve, to_yaml
from cramlm.data.prepare import cache_dir, output_folder
from cramlm.eval.config import EvalConfig
from cramlm.io import write_json
from cramlm.train.impl import launcher_env
from cramlm.run.config import PretrainConfig, format_hours, readable_budget

STAGES = ("data", "pretrain", "eval", "eval-untrained", "report")
Stage = Literal["data", "pretrain", "eval", "eval-untrained", "report"]
TWIN = "eval-untrained"
# stages whose result does not depend on the training, so a re-trained run keeps it while its key holds
INDEPENDENT = {TWIN}
DEFAULT_RECIPE = "default"
RECORD = "pipeline.json"
DRYRUN_MICROBATCH = 8  # sequences per microbatch of a dry run's pretraining steps (cramlm run dryrun=true)
DRYRUN_PAIRS = 16  # minimal pairs a dry run scores per paradigm


class PipelineConfig(PretrainConfig):
    """Everything ``cramlm pretrain`` takes, plus the evaluation and which stages to run."""

    description: str = Field("", description="one line about the recipe, shown by `cramlm run --list`")
    eval: EvalConfig = Field(EvalConfig(), description="the tasks and fine-tuning protocol of the eval stages (the eval group)")
    stages: list[Stage] = Field(
        list(STAGES), description="the stages to run, in pipeline order: data, pretrain, eval, eval-untrained, report")
    untrained_twin: bool = Field(
        True, description="also evaluate the untrained twin (the eval-untrained stage): the baseline pretraining must beat")
    force: list[Stage] = Field([], description="stages to redo even when recorded as finished (the later stages follow)")

    def pretrain_config(self) -> PretrainConfig:
        cfg = _subset(PretrainConfig, self, overwrite=False)  # run_pipeline empties the folder once (overwrite=true)
        if self.dryrun:  # a dry run shows that every stage runs, not how well: small steps, one microbatch of validation
            impl = cfg.impl.model_copy(update={"microbatch_size": min(cfg.impl.microbatch_size, DRYRUN_MICROBATCH)})
            cfg = cfg.model_copy(update={"impl": impl, "train": cfg.train.model_copy(update={"validate_sequences": impl.microbatch_size})})
        return cfg

    def eval_config(self, untrained: bool = False):
        from cramlm.eval.evaluate import EvalRunConfig

        cfg = _subset(EvalRunConfig, self, checkpoint=str(self.run_dir), untrained=untrained)
        if self.dryrun:  # a few steps of everything: one short epoch on a sample of each task, a few pairs
            pairs = cfg.eval.minimal_pairs
            small = {"epochs": 1, "max_train_examples": min(self.eval.max_train_examples or 64, 64),
                     "max_dev_examples": min(self.eval.max_dev_examples or 64, 64),
                     "minimal_pairs": pairs.model_copy(update={"max_pairs": min(pairs.max_pairs or DRYRUN_PAIRS, DRYRUN_PAIRS)})}
            cfg.eval = cfg.eval.model_copy(update={k: v for k, v in small.items() if k in type(cfg.eval).model_fields})
        return cfg


def _subset(cls, cfg: PipelineConfig, **extra: Any):
    """``cls`` built from the fields of ``cfg`` it shares (so fields added to it later flow through)."""
    dump = cfg.model_dump(mode="json")
    return cls.model_validate({**{k: v for k, v in dump.items() if k in cls.model_fields}, **extra})


# ------------------------------------------------------------------------------------ recipes


def recipe_tree(recipe: str) -> tuple[dict[str, Any], list[str]]:
    """(keys of the recipe, its ``overrides`` as key=value strings)."""
    tree = load_preset("run", recipe)
    overrides = tree.pop("overrides", None) or {}
    if "name" not in load_yaml(preset_path("run", recipe), "run"):  # its own, never the name of the recipe it extends
        tree["name"] = Path(recipe).stem
    # JSON is YAML, so every value survives the key=value round trip with its type
    return tree, [f"{key}={json.dumps(value)}" for key, value in overrides.items()]


def resolve_recipe(recipe: str = DEFAULT_RECIPE, overrides: list[str] | tuple[str, ...] = (),
                   plan_arch: dict[str, Any] | None = None) -> PipelineConfig:
    """The recipe's config with ``overrides``. With ``arch=auto``, ``plan_arch`` (keyword arguments
    for :func:`cramlm.pipeline.plan.plan`, e.g. ``{"say": print}``) plans the shape; without it the
    config keeps the planner's starting shape (``AUTO_ARCH``), as ``cramlm plan`` itself resolves it."""
    tree, recipe_overrides = recipe_tree(recipe)
    user = list(overrides)
    auto = tree.get("arch") == "auto"
    for overrides_list in (recipe_overrides, user):  # a later arch= selection wins
        for i, override in enumerate(overrides_list):
            key, _, value = override.partition("=")
            if key.strip().lstrip("+") == "arch":
                auto = value.strip().strip("'\"") == "auto"
                if auto:
                    overrides_list[i] = f"arch={AUTO_ARCH}"
    if not auto:
        return resolve(PipelineConfig, tree, recipe_overrides + user)  # type: ignore[return-value]
    tree["arch"] = AUTO_ARCH
    cfg = resolve(PipelineConfig, tree, recipe_overrides + user)
    if plan_arch is None:
        return cfg  # type: ignore[return-value]
    return resolve(PipelineConfig, tree, recipe_overrides + planned_overrides(cfg, recipe, plan_arch) + user)  # type: ignore[return-value]


AUTO_ARCH = "crammed-bert-tiny"  # arch=auto: the preset the planner resizes
PLAN = "plan.json"


def plan_key(cfg: PipelineConfig, law_path: str | None = None) -> str:
    """What a plan's shape depends on: the budget, the starting arch, sequence length and vocabulary,
    the implementation it was measured with, the optimizer type and the objective (a training step of
    them is measured) and the law (the shipped one follows the optimizer); not the run's name, resume
    or dryrun flags, checkpoint or logging settings, nor the lr (a recorded plan's lr and masking are
    written again from this config: ``fresh_hyperparameters``)."""
    return plan_keys(cfg, law_path)[0]


def plan_keys(cfg: PipelineConfig, law_path: str | None = None) -> tuple[str, ...]:
    """This config's plan key, then the keys plans were recorded under before (still accepted: the
    same shape's inputs, fewer of them named): without the optimizer type and objective, and with
    the lr among them."""
    from cramlm.pipeline.plan import default_law

    impl, train = cfg.impl, cfg.train
    common = [cfg.budget, cfg.arch.model_dump(mode="json"), cfg.data.seq_length, cfg.data.tokenizer.vocab_size,
              [impl.device, impl.precision, impl.threads, impl.microbatch_size], train.mlm_probability,
              law_path or default_law(train.optim.type)]
    return (_hash([*common, [train.optim.type, train.objective]]), _hash(common),
            _hash([*common, [train.optim.type, train.optim.lr, train.objective]]))


PLANNED_HYPERPARAMETERS = ("train.optim.lr=", "train.mlm_probability=")


def fresh_hyperparameters(cfg: PipelineConfig, overrides: list[str], law_path: str | None) -> list[str]:
    """A recorded plan's overrides with its lr and masking rate as the planner gives them for this
    config now (the law's where the recipe has its optimizer, else the recipe's own): a plan records
    a shape, and an lr changed since is never undone by it."""
    from cramlm.pipeline.plan import load_law, planned_hyperparameters

    hp = planned_hyperparameters(cfg, load_law(law_path, cfg.train.optim.type))
    kept = [o for o in overrides if not o.startswith(PLANNED_HYPERPARAMETERS)]
    return [*kept, f"train.optim.lr={hp['lr']:g}", f"train.mlm_probability={hp['mlm_probability']:g}"]


def planned_overrides(cfg: PipelineConfig, recipe: str, plan_args: dict[str, Any]) -> list[str]:
    """arch=auto: the planner's choice as overrides, from ``<run>/plan.json`` when it was planned
    with the same settings (a re-run or a resume must not re-measure into another shape).
    ``plan_args``: keyword arguments for :func:`cramlm.pipeline.plan.plan`, plus ``reuse_only``
    (``--show``: apply a recorded plan, never measure). A dry run and a torchrun process never
    measure either: they take a recorded plan or, with none, the starting shape (dry run) or an error."""
    from cramlm.config.loader import ConfigError
    from cramlm.pipeline.plan import plan as plan_budget

    args = dict(plan_args)
    say, reuse_only = args.get("say", print), args.pop("reuse_only", False)
    if not cfg.budget:
        raise ConfigError("arch=auto plans the model for a wall-clock budget: set one, e.g. budget=1h")
    key = plan_key(cfg, args.get("law_path"))
    path = cfg.run_dir / PLAN
    try:
        record = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError):
        record = {}
    if record.get("key") in plan_keys(cfg, args.get("law_path")) and isinstance(record.get("overrides"), list):
        overrides = fresh_hyperparameters(cfg, [str(o) for o in record["overrides"]], args.get("law_path"))
        say(f"cramlm run: arch=auto: the plan in {path}: " + " ".join(overrides))
        return overrides
    if reuse_only or cfg.dryrun:
        say(f"cramlm run: arch=auto: no plan recorded in {path}; {'a dry run' if cfg.dryrun else 'shown'} with the "
            f"planner's starting shape ({AUTO_ARCH}); `cramlm run` measures and plans")
        return []
    if launcher_env()[2] > 1:
        raise ConfigError(f"arch=auto under torchrun: plan once first, without torchrun (`cramlm run {recipe} ... "
                          "arch=auto stages=[data]` records the plan in <run>/plan.json), then every process reuses it")
    say(f"cramlm run: arch=auto: planning the model for {format_hours(cfg.budget)} on this machine (cramlm plan) ...")
    result = plan_budget(cfg, recipe, **args)
    overrides = result["overrides"]
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, {"key": key, "overrides": overrides, **{k: result[k] for k in ("choice", "why", "candidates", "law")}})
    return overrides


def list_recipes() -> list[tuple[str, str]]:
    """(name, description) of every shipped run recipe."""
    return [(name, str(load_preset("run", name).get("description", ""))) for name in available_presets("run")]


# ---------------------------------------------------------------------------- stage records


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]


# where a run is also logged, how long a collective may wait, and how fast it runs (threads, compilation,
# recomputation, prefetching, the checkpoint layout, DDP or FSDP, the document-attention kernel) change
# nothing it makes but the last bits of its floats: a re-run with another is not trained again
NOT_WHAT_IT_MAKES = ("tensorboard", "wandb", "wandb_mode", "wandb_project", "dist_timeout", "threads", "compile",
                     "compile_mode", "inductor", "activation_checkpointing", "prefetch", "checkpoint_format", "distributed",
                     "document_attention_kernel", "data_cache")  # (where the data cache lives: the data stage's key holds it)


def _at_defaults(impl: dict[str, Any], fields: tuple[str, ...]) -> None:
    """Key ``fields`` of an impl dump at their defaults: a run made with other values is found again,
    and the keys of runs recorded at them stay as they were."""
    from cramlm.train.impl import ImplConfig

    for field in fields:
        if field in impl:
            impl[field] = ImplConfig.model_fields[field].get_default(call_default_factory=True)


# the stage keys' earlier forms (``migrate_keys`` finds stages recorded under them): 0, before resume,
# allow_change and the logging sinks left the keys and the objective entered the twin's; 1, before how
# fast a run goes (and where its data cache lives) left them; 2, today's
GENERATION = 2
_AT_DEFAULTS = {0: (), 1: NOT_WHAT_IT_MAKES[:5], 2: NOT_WHAT_IT_MAKES}


def stage_keys(cfg: PipelineConfig, generation: int = GENERATION, impl_then: dict[str, Any] | None = None) -> dict[str, str]:
    """What each stage's result depends on. Progress bars and the stage list do not count.
    ``generation``: the keys as an earlier cramlm recorded them (``migrate_keys``), with the impl
    fields today's leave out taken from ``impl_then`` (the run's config.yaml: how it ran) where given."""
    pre = key_dump(cfg.pretrain_config())
    pre.pop("overwrite", None)
    ev = key_dump(cfg.eval_config())
    for impl in (pre["impl"], ev["impl"]):
        if impl_then and generation < GENERATION:
            impl.update({k: impl_then[k] for k in NOT_WHAT_IT_MAKES if k in impl_then and k in impl})
        # how a stage runs, not what it makes: keyed at their defaults, so the keys of runs recorded before stay as they were
        _at_defaults(impl, _AT_DEFAULTS[generation])
        impl.pop("progress", None)
    if generation >= 1:  # a run finished with --resume auto is the result of one that ran through (and is skipped)
        pre["resume"], pre["allow_change"] = None, []
    if pre["train"].get("objective") == "mlm":  # the default objective keys as before train.objective existed
        pre["train"].pop("objective")
        pre["train"].pop("rtd", None)
    ev["eval"].get("minimal_pairs", {}).pop("save_every", None)  # how often scores are kept, not what is scored
    keys = {"data": cfg.data.cache_key() + ":" + str(cache_dir(cfg.impl.data_cache)), "pretrain": _hash(pre)}
    from cramlm.data.heldout import DEFINITION  # a new held-out definition re-runs both evaluations

    keys["eval"] = _hash([keys["pretrain"], ev["eval"], ev["impl"], DEFINITION])
    # the twin's random weights come from the architecture, the tokenizer (the data key) and eval.seed;
    # what is built and scored of them from the objective (ELECTRA's generator, the hybrid's scorer)
    objective = {k: pre["train"][k] for k in ("objective", "rtd", "hybrid", "objective_options") if k in pre["train"]} \
        if "objective" in pre["train"] and generation >= 1 else {}  # (the default objective, mlm, keys as before it was in this key)
    # (the data by its config, not where its cache lives: a moved cache holds the same tokenizer)
    data = keys["data"] if generation < 2 else cfg.data.cache_key()
    keys[TWIN] = _hash([pre["arch"], data, ev["eval"], ev["impl"], DEFINITION, *([objective] if objective else [])])
    keys["report"] = _hash([keys["pretrain"], keys["eval"], keys[TWIN] if cfg.untrained_twin else None])
    return keys


def stage_outputs(cfg: PipelineConfig, stage: str) -> list[Path]:
    run = cfg.run_dir
    if stage == "data":
        return [output_folder(cfg.data, cfg.impl.data_cache) / "manifest.json"]
    return {
        "pretrain": [run / "model.safetensors", run / "config.yaml", run / "summary.json", run / "metrics.jsonl"],
        "eval": [run / "eval.json"],
        TWIN: [run / "eval-untrained.json"],
        "report": [run / "report.html"],
    }[stage]


def read_record(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((run_dir / RECORD).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def finished(cfg: PipelineConfig, stage: str, record: dict[str, Any], key: str) -> bool:
    entry = record.get("stages", {}).get(stage, {})
    return entry.get("status") == "done" and entry.get("key") == key and all(p.is_file() for p in stage_outputs(cfg, stage)) \
        and not replaced_outputs(cfg, stage, entry)


# the evaluations' results: small files another command may write into the run folder (`cramlm eval`)
DIGESTED = ("eval", TWIN)


def output_digests(cfg: PipelineConfig, stage: str) -> dict[str, str]:
    """{file name: sha256} of an evaluation stage's results ({} for the other stages)."""
    if stage not in DIGESTED:
        return {}
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()[:16] for p in stage_outputs(cfg, stage) if p.is_file()}


def replaced_outputs(cfg: PipelineConfig, stage: str, entry: dict[str, Any]) -> list[str]:
    """The results the stage made that another command has written over since (a `cramlm eval`
    into the run folder under its own protocol): the stage is not done."""
    made = entry.get("outputs") or {}
    now = output_digests(cfg, stage) if made else {}
    return sorted(name for name, digest in made.items() if name in now and now[name] != digest)  # (a lost file: not done either)


# ------------------------------------------------------------------------------------ stages


def run_data(cfg: PipelineConfig) -> dict[str, Any]:
    from cramlm.data.prepare import prepare_data

    from cramlm.train.checkpoint import checkpoint_dirs

    # a run that continues from a checkpoint (pretrain finds and vets which): changed inputs are said, not refused
    resuming = cfg.resume is not None and (cfg.resume != "auto" or bool(checkpoint_dirs(cfg.run_dir / "checkpoints")))
    prepared = prepare_data(cfg.data, cfg.impl.data_cache, progress=cfg.impl.progress, resuming=resuming)
    m = prepared.manifest
    return {"folder": str(prepared.folder), "train_tokens": m["train"]["tokens"], "val_tokens": m["val"]["tokens"]}


def run_pretrain(cfg: PipelineConfig) -> dict[str, Any]:
    from cramlm.run.pretrain import pretrain

    summary = pretrain(cfg.pretrain_config(), replace=True)  # run_pipeline checked the folder is this recipe's
    return {k: summary.get(k) for k in ("parameters", "steps", "tokens", "last_loss") if k in summary}


def run_eval(cfg: PipelineConfig) -> dict[str, Any]:
    from cramlm.eval.evaluate import evaluate

    results = evaluate(cfg.eval_config())
    return {r.get("task", str(i)): r.get("score") for i, r in enumerate(results)}


def run_eval_untrained(cfg: PipelineConfig) -> dict[str, Any]:
    from cramlm.eval.evaluate import evaluate

    results = evaluate(cfg.eval_config(untrained=True))
    return {r.get("task", str(i)): r.get("score") for i, r in enumerate(results)}


def run_report(cfg: PipelineConfig) -> dict[str, Any]:
    from cramlm.report import write_report

    path = write_report(cfg.run_dir)
    return {"report": str(path)}


RUNNERS = {"data": run_data, "pretrain": run_pretrain, "eval": run_eval, TWIN: run_eval_untrained, "report": run_report}


def selected(cfg: PipelineConfig) -> list[str]:
    """The stages this config runs, in pipeline order."""
    return [s for s in STAGES if s in cfg.stages and (s != TWIN or cfg.untrained_twin)]


def migrate_keys(cfg: PipelineConfig, record: dict[str, Any], keys: dict[str, str]) -> bool:
    """Stages recorded under an earlier form of their key (``GENERATION``) that this config makes the
    same way take this config's key: a run finished with --resume auto, a logging sink or another
    thread count before those left the key is not trained or evaluated again, nor its results set
    aside. The impl fields the earlier forms held come from the run's config.yaml (how it ran) as
    well as from this config, so a re-run without the README's impl.threads=1 finds it too. Whether
    the record changed."""
    from cramlm.config.loader import load_yaml

    earlier: list[tuple[int, dict[str, str]]] | None = None
    changed, stages = False, record.get("stages", {})
    for stage in [s for s in STAGES if s != TWIN] + [TWIN]:  # the twin last: it may follow the pretrain stage's
        entry = stages.get(stage)
        if stage not in keys or not isinstance(entry, dict) or entry.get("key") in (None, keys[stage]):
            continue
        if earlier is None:
            try:
                then = (load_yaml(cfg.run_dir / "config.yaml", "run config") or {}).get("impl") or {}
            except Exception:  # noqa: BLE001 - no config.yaml to read: this config's own values
                then = {}
            earlier = [(g, stage_keys(cfg, g, impl)) for g in range(GENERATION) for impl in ([{}, then] if then else [{}])]
        generation = next((g for g, k in earlier if entry["key"] == k.get(stage)), None)
        if generation is None:
            continue
        # the earliest twin key holds no objective: another objective's twin (ELECTRA's, the hybrid's) has the
        # same one, so it is taken only where the trained model is this config's (the objective with it)
        if stage == TWIN and generation == 0 and cfg.train.objective != "mlm" \
                and (stages.get("pretrain") or {}).get("key") != keys["pretrain"]:
            continue
        entry["key"], changed = keys[stage], True
    return changed


def stages_to_run(cfg: PipelineConfig, record: dict[str, Any]) -> list[str]:
    """The stages to run now: selected, and unfinished or forced or after one that runs (a stage
    independent of the training runs after one that runs only if its own key changed)."""
    keys, todo = stage_keys(cfg), []
    # the data prepared again with the same config (its cache moved, or forced) gives the same bytes: the
    # stages after it need not follow
    then = (record.get("stages", {}).get("data") or {}).get("key") or ""
    same_data = then.split(":")[0] == keys["data"].split(":")[0]
    for stage in selected(cfg):
        follows = bool(todo) and not (stage in INDEPENDENT and set(todo) <= {"pretrain", "eval"}) \
            and not (todo == ["data"] and same_data)
        if follows or stage in cfg.force or not finished(cfg, stage, record, keys[stage]):
            todo.append(stage)
    return todo


def reconcile_results(cfg: PipelineConfig, record: dict[str, Any], keys: dict[str, str]) -> bool:
    """Evaluation results made under another configuration than this run's (a changed training or
    evaluation) that this run does not redo (the stage not selected, or the twin switched off) are
    renamed ``<stem>.stale.<ext>`` and so recorded: the report and the console never show them as
    this run's, and nothing is deleted. Set-aside results whose configuration is this run's again
    come back (nothing is recomputed). Whether the record changed."""
    changed, chosen = False, selected(cfg)
    for stage in ("eval", TWIN):
        entry = record.get("stages", {}).get(stage)
        if not entry:
            continue
        stem = stage_outputs(cfg, stage)[0].stem
        if entry.get("status") == "stale" and entry.get("key") == keys[stage]:
            back = sorted(cfg.run_dir.glob(f"{stem}.stale.*"))
            for path in back:
                os.replace(path, path.with_name(f"{stem}{path.suffix}"))
            if back:
                entry["status"], changed = "done", True
                print(f"cramlm run: {stage}: {stem}.stale.* are this configuration's again: restored")
            continue
        if stage in chosen or entry.get("key") == keys[stage] or entry.get("status") == "stale":
            continue  # (a selected stage with another key is redone, its files replaced)
        moved = []
        for path in sorted(cfg.run_dir.glob(f"{stem}.*")):
            if path.suffix in (".json", ".md", ".csv") and ".stale." not in path.name and ".partial." not in path.name:
                os.replace(path, path.with_name(f"{stem}.stale{path.suffix}"))
                moved.append(path.name)
        entry["status"], changed = "stale", True
        if moved:
            print(f"cramlm run: {stage}: {', '.join(moved)} came from an earlier configuration and this run does not "
                  f"redo it: renamed {stem}.stale.* (add '{stage}' to stages, or untrained_twin=true, to evaluate again)")
    return changed


def claim_folder(cfg: PipelineConfig, recipe: str | None) -> None:
    """A run folder is the pipeline's when its record names this recipe (or none: a `cramlm run`
    without a recipe name); a folder holding another recipe's run or a bare `cramlm pretrain`
    run is refused unless ``overwrite=true`` (which deletes it whole) or a resume continues it."""
    from cramlm.locks import FolderLock
    from cramlm.run.folder import RUN_LOCK, claim_run_dir

    record = read_record(cfg.run_dir)
    theirs = record.get("recipe")
    mine = bool(record) and (theirs is None or recipe is None or theirs == recipe)
    if mine and not cfg.overwrite:
        return  # the pipeline's own folder: finished stages are skipped, changed ones redone
    if cfg.resume is not None:
        if record and not mine:  # a resume continues its own recipe's run, never takes over another's
            raise ValueError(f"run folder {cfg.run_dir} holds recipe {theirs}'s run: resume it with `cramlm run {theirs} "
                             f"name={cfg.name} --resume auto`, or give this run another name")
        return
    if not cfg.run_dir.is_dir():
        return
    if cfg.overwrite and launcher_env()[2] > 1:
        raise ValueError("overwrite=true under torchrun: overwrite once without torchrun (`cramlm run ... overwrite=true "
                         "stages=[data]`), then run every process")
    whose = f"recipe {theirs}'s run" if record else "a `cramlm pretrain` run"
    with FolderLock(cfg.run_dir / RUN_LOCK, f"run folder {cfg.run_dir}"):
        # (arch=auto's plan.json, just made or reused for this very config, stays: overwrite must not re-measure)
        claim_run_dir(cfg.run_dir, cfg.overwrite, f"`cramlm run {recipe}`" if recipe else "`cramlm run`", whose, keep=(PLAN,))


def run_pipeline(cfg: PipelineConfig, recipe: str | None = None) -> dict[str, Any]:
    """Run the selected stages, skipping finished ones; returns the stage record. ``recipe``: the
    recipe's name, recorded; a folder holding another recipe's run is refused (``claim_folder``).

    Under ``torchrun`` every process runs this with the same config: all decide from the same
    record which stages run, only rank 0 prepares data, evaluates, reports and writes the record,
    and the others join the pretrain stage (whose processes the training engine coordinates).
    """
    from cramlm.config.extras import check_extras

    check_extras(cfg)  # a missing optional dependency fails now, before any stage runs
    if "eval" in cfg.stages and not cfg.eval.tasks and not cfg.eval.minimal_pairs.paths:  # fail now, not after hours of training
        raise ValueError("eval.tasks is empty: name task folders (eval.tasks=[path,...]) or minimal pairs "
                         "(eval.minimal_pairs.paths=[...]), or drop 'eval' from stages")
    if "eval" in cfg.stages and cfg.eval.overrides:  # an override naming no task: now, not after hours of training
        from cramlm.eval.evaluate import check_overrides
        from cramlm.eval.tasks import TaskError

        try:
            check_overrides(cfg.eval)
        except TaskError:
            pass  # a task that does not load: said by the eval stage, if it runs (a finished one need not)
    run_dir = cfg.run_dir
    rank = launcher_env()[0]
    if rank == 0:
        claim_folder(cfg, recipe)
        if launcher_env()[2] == 1:  # (under torchrun pretrain's lock refuses every rank together)
            refuse_if_running(run_dir)
    record = read_record(run_dir)
    record.setdefault("stages", {})
    record["name"] = cfg.name
    if recipe is not None:
        record["recipe"] = recipe
    keys = stage_keys(cfg)
    migrated = migrate_keys(cfg, record, keys)  # (every rank: each decides what runs from the record)
    if rank == 0 and run_dir.is_dir() and (reconcile_results(cfg, record, keys) | migrated):  # (before deciding what runs)
        write_json(run_dir / RECORD, record)
    todo = stages_to_run(cfg, record)
    if "pretrain" in todo:
        cfg = continue_unfinished(cfg, record, keys, main=rank == 0)
    if rank != 0:
        if "pretrain" in todo:
            run_pretrain(cfg)
        return record
    run_dir.mkdir(parents=True, exist_ok=True)
    for stage in selected(cfg):
        if stage not in todo:
            print(f"cramlm run: {stage}: done already, skipped ({run_dir / RECORD})")
            continue
        if (done := record["stages"].get(stage) or {}).get("status") == "done" and stage not in cfg.force:
            if done.get("key") != keys[stage]:
                print(f"cramlm run: {stage}: made before under another configuration{changed_since(cfg, stage)}: made "
                      "again, its results replaced")
            elif replaced := replaced_outputs(cfg, stage, done):
                print(f"cramlm run: {stage}: {', '.join(replaced)} written over since this stage made it (a `cramlm eval` "
                      "into the run folder?): made again under the run's own configuration")
        print(f"cramlm run: {stage} ...")
        start, before = time.perf_counter(), record["stages"].get(stage)
        record["stages"][stage] = {"status": "running", "key": keys[stage], "started": _now()}
        write_json(run_dir / RECORD, record)
        try:
            info = RUNNERS[stage](cfg)
        except BaseException as e:  # record the failure (also Ctrl-C) so a re-run redoes this stage
            from cramlm.locks import LockHeld
            from cramlm.train.preemption import Interrupted

            if isinstance(e, LockHeld):  # the stage is another process's, running: its record entry stays
                if before is None:
                    record["stages"].pop(stage)
                else:
                    record["stages"][stage] = before
                write_json(run_dir / RECORD, record)
                raise
            stopped = isinstance(e, (Interrupted, KeyboardInterrupt))  # a signal: pretrain's checkpoint is written
            record["stages"][stage].update(status="interrupted" if stopped else "failed", error=f"{type(e).__name__}: {e}"[:500])
            write_json(run_dir / RECORD, record)
            raise
        record["stages"][stage].update(status="done", finished=_now(), seconds=round(time.perf_counter() - start, 2), result=info,
                                       **({"outputs": made} if (made := output_digests(cfg, stage)) else {}))
        write_json(run_dir / RECORD, record)
    return record


def refuse_if_running(run_dir: Path) -> None:
    """LockHeld, naming the holder, where another process trains in ``run_dir`` now: before any stage
    runs or the record changes (its stage is that process's, recorded as running). Two started at
    once may both pass; the second is then refused by pretrain's own lock, its record entry put back."""
    from cramlm.locks import FolderLock
    from cramlm.run.folder import RUN_LOCK

    if (run_dir / RUN_LOCK).is_file():
        FolderLock(run_dir / RUN_LOCK, f"run folder {run_dir}").acquire().release()


def continue_unfinished(cfg: PipelineConfig, record: dict[str, Any], keys: dict[str, str], main: bool = True) -> PipelineConfig:
    """A pretrain stage cut off (a kill, a signal, an error) and run again without ``--resume``: under
    the same configuration it continues, as with ``--resume auto`` (its checkpoints, or its log where
    it wrote none, are the run's; starting it afresh would delete them); under another it is refused,
    naming what changed and the ways out. ``overwrite=true`` or ``force=[pretrain]`` start it afresh.
    (A pretraining running now in another process was refused before: ``refuse_if_running``.)"""
    from cramlm.train.checkpoint import checkpoint_dirs, written_state

    entry = (record.get("stages") or {}).get("pretrain") or {}
    if cfg.resume is not None or cfg.overwrite or "pretrain" in cfg.force or entry.get("status") not in ("running", "interrupted", "failed"):
        return cfg
    newest = checkpoint_dirs(cfg.run_dir / "checkpoints")[-1:]
    same = entry.get("key") == keys["pretrain"]
    if same and newest and pretrain_diff(cfg, (written_state(newest[0]).get("run") or {}).get("config") or {}):
        return cfg  # an earlier configuration's checkpoint (its retraining cut off before it cleared them): afresh, as asked
    if not (newest or (same and (cfg.run_dir / "metrics.jsonl").is_file())):
        return cfg  # nothing to continue, or only the log of a start under another configuration
    how = {"running": "cut off", "interrupted": "stopped by a signal", "failed": "stopped by an error"}[entry["status"]]
    where = f"its newest checkpoint {newest[0].name}" if newest else "no checkpoint, its metrics.jsonl"
    if not same:
        raise ValueError(f"{cfg.run_dir} holds a pretraining {how} ({where}) under another configuration"
                         f"{changed_since(cfg, 'pretrain')}: continue it with --resume auto (and --allow-change KEY for a "
                         "change a resume may make), start it afresh with force=[pretrain], or delete that folder")
    if main:
        print(f"cramlm run: pretrain: the run in {cfg.run_dir} was {how} ({where}): continuing it, as --resume auto does "
              "(overwrite=true or force=[pretrain] starts it afresh)")
    return cfg.model_copy(update={"resume": "auto"})


def changed_since(cfg: PipelineConfig, stage: str) -> str:
    """The pretraining keys that differ from the run folder's config.yaml (the config it was trained
    with), as ``" (key old -> new, ...)"``; "" where there is none to compare or nothing differs there
    (another stage's settings changed)."""
    from cramlm.config.loader import load_yaml

    if stage not in ("pretrain", "eval") or not (cfg.run_dir / "config.yaml").is_file():
        return ""
    try:
        then = load_yaml(cfg.run_dir / "config.yaml", "run config")
    except Exception:  # noqa: BLE001 - a note, never a failure
        return ""
    diff = pretrain_diff(cfg, then)
    return f" ({', '.join(diff[:4])}{', ...' if len(diff) > 4 else ''})" if diff else ""


def pretrain_diff(cfg: PipelineConfig, then: dict[str, Any]) -> list[str]:
    """``key old -> new`` for each pretraining setting of ``cfg`` that differs from the config ``then``
    (a run's config.yaml, a checkpoint's), how it runs aside (the name, resume, progress, threads...)."""
    from cramlm.train.checkpoint import flat

    then, now = flat(then), flat(cfg.pretrain_config().model_dump(mode="json"))
    skip = ("name", "base_dir", "resume", "allow_change", "overwrite", "impl.progress")
    return [f"{k} {then[k]} -> {now[k]}" for k in sorted(then.keys() & now.keys())
            if then[k] != now[k] and not k.startswith(skip) and not (k.startswith("impl.") and k.split(".")[1] in NOT_WHAT_IT_MAKES)]


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def results_summary(cfg: PipelineConfig) -> str:
    """The console's closing tables: per task the pretrained score, the untrained twin's, the
    margin and the majority class; the zero-shot minimal pairs beside the twin's; then the verdict,
    what pretraining bought (empty when the run has no eval.json)."""
    from cramlm.eval.tables import verdict, versus_text

    def load(name: str) -> dict[str, Any] | None:
        try:
            return json.loads((cfg.run_dir / name).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    if launcher_env()[0] != 0:  # under torchrun, rank 0 speaks for the run
        return ""
    pretrained = load("eval.json")
    if not pretrained:
        return ""
    untrained = load("eval-untrained.json") if cfg.untrained_twin else None
    pairs = pretrained.get("minimal_pairs") or {}
    zero_shot = ""
    if "scores" in pairs:  # beside the twin's headline (eval/pairs.py)
        from cramlm.eval.pairs import pairs_text

        twin = (untrained or {}).get("minimal_pairs")
        zero_shot = pairs_text(pairs, twin if isinstance(twin, dict) and "scores" in twin else None)
    said = verdict(pretrained, untrained, cfg.dryrun)  # last: what pretraining bought, fine-tuned and zero-shot
    said = f"\n{said}\n" if said else ""
    if not pretrained.get("results"):
        return zero_shot + said
    title = "dev scores (%), pretrained against the untrained twin (same architecture, random weights):" if untrained \
        else "dev scores (%):"
    return title + "\n" + versus_text(pretrained, untrained, say_verdict=False) + (f"\n{zero_shot}" if zero_shot else "") + said


def describe(cfg: PipelineConfig) -> str:
    """`cramlm run --show`: the resolved config, its budget as written ('1m', not 0.0166...)."""
    import yaml

    return yaml.safe_dump(readable_budget(cfg.model_dump(mode="json")), sort_keys=False)
