"""The run stage: a run's config (config.py), built from it in one place (build.py), its folder
(folder.py), what the console says (console.py), and ``cramlm pretrain`` (pretrain.py, the entry
point: libraries import the modules beside it, never it)."""
