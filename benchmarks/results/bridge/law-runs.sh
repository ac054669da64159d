#!/bin/bash
# The runs that separate model size from tokens per parameter in the multiplier law (law.md: in the
# committed rows log N and log D/N correlate at -0.97, so the full law cannot be carried to a GPU day).
# Each adds a size at a tokens-per-parameter ratio another size already has; AdamW's frontier at each
# size reaches their FLOPs already (recipe_multiplier/budget-rows.json), so only the recipe trains.
# Uses recipe_multiplier/screen-2026-12-03.sh as outputs/run1.sh; then
# `python benchmarks/frontier_lr_check.py --budget-rows --runs outputs/screen` and multiplier_law.py.
#   256x4 at 4x its budget (1.6e14, D/N 2.7: between 128x4's 1x and 256x4's 2x) ~1.5 core-hours
#   384x6 at 4x its budget (2.4e14, D/N 0.37: 256x4's 1x and 2x bracket it)      ~2 core-hours
M="train.optim.type=muon arch.qk_norm=true arch.zero_init_out=true train.optim.split_fused=true"
DATA=outputs/bridge/data outputs/run1.sh ${1:-0} 256x4-x4-mom0.85-s0 256x4 1.6e14 $M train.optim.lr=1.6e-2 seed=0
DATA=outputs/bridge/data outputs/run1.sh ${1:-0} 384x6-x4-mom0.85-s0 384x6 2.4e14 $M train.optim.lr=8e-3 seed=0
