"""Remote-code export for variants no stock transformers class expresses (e.g. cramming's own
crammed-bert: scaled sinusoidal positions, GELU-GLU, LayerNorms with biases but linear layers
without). The folder gets ``modeling_cramlm.py`` = our model.py verbatim + the thin wrappers of
hf_modeling.py, and ``configuration_cramlm.py`` = hf_configuration.py, so the exported model runs
the very code that was trained; the weights keep our names."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import torch

from cramlm.io import save_safetensors
from cramlm.models.base import tied_aliases

# hf_modeling.py's cramlm imports -> what they become in the export
EXPORT_IMPORTS = {
    "from cramlm.models.hf_configuration import": "from .configuration_cramlm import CramlmConfig",
    "from cramlm.models.model import": None,  # model.py's names: its source precedes the wrappers
}


def module_source(module) -> str:
    """A module's source, read as ``inspect.getsource`` would but without importing the module
    (the wrappers import transformers, which exporting does not need)."""
    return importlib.util.find_spec(module).loader.get_source(module)


def exported_modeling() -> str:
    """modeling_cramlm.py: model.py verbatim, then hf_modeling.py with its cramlm imports rewritten
    (model.py's names are defined above it; the config sits beside it as configuration_cramlm.py)."""
    wrappers = []
    for line in module_source("cramlm.models.hf_modeling").splitlines():
        if line.startswith(("from cramlm", "import cramlm")):
            prefix = next((p for p in EXPORT_IMPORTS if line.startswith(p)), None)
            if prefix is None:  # the export would not run without cramlm installed
                raise AssertionError(f"hf_modeling.py: '{line}' has no rewrite in EXPORT_IMPORTS")
            if EXPORT_IMPORTS[prefix] is None:
                continue
            line = EXPORT_IMPORTS[prefix]
        wrappers.append(line)
    body = "\n".join(wrappers)
    header = "\n\n# ---- transformers wrappers (hf_modeling.py, written by `cramlm export hf`) " + "-" * 24 + "\n\n"
    return module_source("cramlm.models.model") + header + body + "\n"


def export_remote(model: torch.nn.Module, out_dir: Path, special: dict[str, int]) -> str:
    """Write config.json, configuration_cramlm.py, modeling_cramlm.py and model.safetensors."""
    cfg = model.cfg
    mlm = cfg.objective == "mlm"
    cls = "CramlmForMaskedLM" if mlm else "CramlmForCausalLM"
    (out_dir / "configuration_cramlm.py").write_text(module_source("cramlm.models.hf_configuration"))
    (out_dir / "modeling_cramlm.py").write_text(exported_modeling())
    auto = "AutoModelForMaskedLM" if mlm else "AutoModelForCausalLM"
    config = {
        "model_type": "cramlm",
        "architectures": [cls],
        "auto_map": {"AutoConfig": "configuration_cramlm.CramlmConfig", auto: f"modeling_cramlm.{cls}"},
        "objective": cfg.objective,
        "vocab_size": model.vocab_size,
        "pad_token_id": special.get("pad"),
        "bos_token_id": special.get("bos"),
        "eos_token_id": special.get("eos"),
        "tie_word_embeddings": cfg.tie_embeddings,
        "cramlm": cfg.model_dump(),
    }
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    # a tied decoder once, as in the run (the wrapper ties it again on loading); own storage each
    aliases = tied_aliases(model)
    weights = {name: t.detach().contiguous().clone() for name, t in model.state_dict().items() if name not in aliases}
    save_safetensors(weights, out_dir / "model.safetensors", metadata={"format": "pt"})
    return cls
