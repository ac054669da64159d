"""Remote-code export for variants no stock transformers class expresses (e.g. cramming's own
crammed-bert: scaled sinusoidal positions, GELU-GLU, LayerNorms with biases but linear layers
without). The folder gets ``modeling_cramlm.py`` = our model.py verbatim + the thin wrappers of
hf_modeling.py, and ``configuration_cramlm.py`` = hf_configuration.py, so the exported model runs
the very code that was trained; the weights keep our names."""

from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path

import torch

from cramlm.io import save_safetensors
from cramlm.models.base import tied_aliases

# hf_modeling.py's cramlm imports -> what they become in the export (a module's name: the imported
# functions' source, copied in; they must need nothing but torch)
EXPORT_IMPORTS = {
    "from cramlm.models.heads import": "cramlm.models.heads",
    "from cramlm.models.hf_configuration import": "from .configuration_cramlm import CramlmConfig",
    "from cramlm.models.model import": None,  # model.py's names: its source precedes the wrappers
}


def module_source(module) -> str:
    """A module's source, read as ``inspect.getsource`` would but without importing the module
    (the wrappers import transformers, which exporting does not need)."""
    return importlib.util.find_spec(module).loader.get_source(module)


def function_sources(module: str, names: list[str]) -> str:
    """The source of the top-level functions ``names`` of ``module``, as written there."""
    source = module_source(module)
    defs = {node.name: node for node in ast.parse(source).body if isinstance(node, ast.FunctionDef)}
    return "\n\n\n".join(ast.get_source_segment(source, defs[name]) for name in names)


def exported_modeling() -> str:
    """modeling_cramlm.py: model.py verbatim, then hf_modeling.py with its cramlm imports rewritten
    (model.py's names are defined above it; the config sits beside it as configuration_cramlm.py)."""
    wrappers = []
    for line in module_source("cramlm.models.hf_modeling").splitlines():
        if line.startswith(("from cramlm", "import cramlm")):
            prefix = next((p for p in EXPORT_IMPORTS if line.startswith(p)), None)
            if prefix is None:  # the export would not run without cramlm installed
                raise AssertionError(f"hf_modeling.py: '{line}' has no rewrite in EXPORT_IMPORTS")
            rewrite = EXPORT_IMPORTS[prefix]
            if rewrite is None:
                continue
            if rewrite.startswith("cramlm."):
                names = [n.strip() for n in line[len(prefix):].split("#")[0].split(",")]
                line = function_sources(rewrite, names) + "\n"
            else:
                line = rewrite
        wrappers.append(line)
    body = "\n".join(wrappers)
    header = "\n\n# ---- transformers wrappers (hf_modeling.py, written by `cramlm export hf`) " + "-" * 24 + "\n\n"
    return module_source("cramlm.models.model") + header + body + "\n"


def export_remote(model: torch.nn.Module, out_dir: Path, special: dict[str, int]) -> str:
    """Write config.json, configuration_cramlm.py, modeling_cramlm.py and model.safetensors."""
    cfg = model.cfg
    mlm = cfg.objective == "mlm"
    cls = "CramlmForMaskedLM" if mlm else "CramlmForCausalLM"
    # the LM class first (cramlm's eval loads the first AutoModelFor* entry's base model), then the
    # fine-tuning classes: sequence classification for every export, token classification for encoders
    classes = {("AutoModelForMaskedLM" if mlm else "AutoModelForCausalLM"): cls,
               "AutoModelForSequenceClassification": "CramlmForSequenceClassification"}
    if mlm:
        classes["AutoModelForTokenClassification"] = "CramlmForTokenClassification"
    write_remote(out_dir, classes, cfg, cfg.objective, model.vocab_size, special, model.state_dict(), tied_aliases(model),
                 tie_word_embeddings=cfg.tie_embeddings)
    return cls


def write_remote(out_dir: Path, classes: dict[str, str], cfg, objective: str, vocab_size: int, special: dict[str, int],
                 state: dict[str, torch.Tensor], aliases: dict[str, str], **extra) -> None:
    """One remote-code folder: the code, config.json (``classes``: Auto class -> our class, the
    first one the model's own) and the weights of ``state`` (tied aliases stored once)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "configuration_cramlm.py").write_text(module_source("cramlm.models.hf_configuration"))
    (out_dir / "modeling_cramlm.py").write_text(exported_modeling())
    auto_map = {"AutoConfig": "configuration_cramlm.CramlmConfig", **{k: f"modeling_cramlm.{v}" for k, v in classes.items()}}
    config = {
        "model_type": "cramlm",
        "architectures": [next(iter(classes.values()))],
        "auto_map": auto_map,
        "objective": objective,
        "vocab_size": vocab_size,
        "pad_token_id": special.get("pad"),
        "bos_token_id": special.get("bos"),
        "eos_token_id": special.get("eos"),
        "classifier_pooling": "last" if objective == "clm" else "first",  # CramlmForSequenceClassification's pooled state
        "classifier_dropout": 0.1,
        **extra,
        "cramlm": cfg.model_dump(),
    }
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    # a tied decoder once, as in the run (the wrapper ties it again on loading); own storage each
    weights = {name: t.detach().contiguous().clone() for name, t in state.items() if name not in aliases}
    save_safetensors(weights, out_dir / "model.safetensors", metadata={"format": "pt"})
