"""Pretraining objectives as components (registry kind ``objective``): what a run trains its arch to
do. config.py declares each built-in objective's config (torch-free: validating a run config
imports no torch), base.py holds the :class:`~cramlm.models.objectives.base.Objective` interface,
and each objective is one module that registers it: mlm.py, clm.py, rtd.py (ELECTRA), hybrid.py
(GPT-BERT's masked + causal)."""
