#!/usr/bin/env bash
# bash lane.sh CORE LINE SEED: that line's long run, pinned to CORE (resumes where it stopped)
cd /work/main; . .venv/bin/activate; export CRAMLM_DATA_DIR=/work/shared/data HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec taskset -c $1 python benchmarks/bridge.py long --line $2 --seed $3
