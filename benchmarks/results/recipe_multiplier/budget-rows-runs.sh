#!/bin/bash
# stop 36 (2026-12-03): the runs behind "Each size at twice its budget" (recipe_multiplier.md); run1.sh is screen-2026-12-03.sh
# with base_dir=${BASE:-outputs/screen}; cores 0 and 1, two lanes; DATA: the shared-corpus cache (hash 5d93a30ac320)
# $1: the core (0: the 384x6 run and the recipe's 128x4 runs; 1: the others)
BASE=outputs/frontier-lr DATA=outputs/rvc-m85/data outputs/run1.sh $1 384x6-x8-adamw 384x6 4.8e14 train.optim.type=adamw arch.qk_norm=false arch.zero_init_out=false train.optim.lr=2e-3 seed=0
M="train.optim.type=muon arch.qk_norm=true arch.zero_init_out=true train.optim.split_fused=true train.optim.lr=1.6e-2"
for s in 0 1; do DATA=outputs/rvc-m85/data outputs/run1.sh $1 128x4-x2-mom0.85-s$s 128x4 4e13 $M seed=$s; done
BASE=outputs/frontier-lr DATA=outputs/rvc-m85/data outputs/run1.sh $1 256x4-x8-adamw 256x4 3.2e14 train.optim.type=adamw arch.qk_norm=false arch.zero_init_out=false train.optim.lr=8e-3 seed=0
BASE=outputs/frontier-lr DATA=outputs/rvc-m85/data outputs/run1.sh $1 128x4-x8-adamw 128x4 1.6e14 train.optim.type=adamw arch.qk_norm=false arch.zero_init_out=false train.optim.lr=1.6e-2 seed=0
BASE=outputs/frontier-lr DATA=outputs/rvc-m85/data outputs/run1.sh 1 384x6-x4-lr0.004 384x6 2.4e14 train.optim.type=adamw arch.qk_norm=false arch.zero_init_out=false train.optim.lr=4e-3 seed=0
