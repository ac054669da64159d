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

# The cheap side of the same question (benchmarks/law_low_budget.py): 128x4 below its 1x, at 6.19e12 FLOPs
# (120 steps, D/N 1.5, where 256x4 stands at 2x), on AdamW's stored frontier from 6.19e12 up; AdamW and
# momentum 0.95 trained again where stored bf16 figures exist (the check that fp32 and the bridge's data
# give the stored points). ~30 core-minutes in all; run from the bridge queue with the code frozen at fce5c85:
R="env DATA=outputs/bridge/data bash benchmarks/results/recipe_multiplier/screen-2026-12-03.sh ${1:-0}"
A="train.optim.type=adamw arch.qk_norm=false arch.zero_init_out=false"
$R law-128x4-e12-mom0.85-s0 128x4 6.19e12 $M train.optim.lr=1.6e-2 seed=0
$R law-128x4-e12-mom0.85-s1 128x4 6.19e12 $M train.optim.lr=1.6e-2 seed=1
$R law-128x4-e12-adamw-lr0.008-s0 128x4 6.19e12 $A train.optim.lr=8e-3 seed=0
$R law-128x4-e12-mom0.95-s0 128x4 6.19e12 $M train.optim.lr=1.6e-2 train.optim.momentum=0.95 seed=0
$R law-128x4-x1-adamw-lr0.016-s0 128x4 2e13 $A train.optim.lr=1.6e-2 seed=0
