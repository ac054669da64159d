#!/usr/bin/env bash
# core 1's queue: the shipped cpu-1h with its own schedule at 1x (seed 0: the WSD check, issue 38's
# cpu-1h row, the single-sentence study's subject), then the hybrid line at 1x, their evaluations,
# then the adamw long run.
cd /work/main; . .venv/bin/activate; export CRAMLM_DATA_DIR=/work/shared/data HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export PYTHONPATH=/root/cramlm-bridge/code/src
bridge=/root/cramlm-bridge/code/benchmarks/bridge.py
taskset -c 1 python $bridge own --line rtd --seed 0 --k 1 || exit 1
taskset -c 1 python $bridge own --line hybrid --seed 0 --k 1 || exit 1
taskset -c 1 python $bridge eval --line rtd --seed 0 --k 1 --schedule own || exit 1
taskset -c 1 python $bridge eval --line hybrid --seed 0 --k 1 --schedule own || exit 1
exec bash /root/cramlm-bridge/lane.sh 1 adamw 0 >> /root/cramlm-bridge/lane-adamw-s0.log 2>&1
