#!/usr/bin/env bash
# bash lane.sh CORE LINE SEED: that line's long run, pinned to CORE (resumes where it stopped).
# Runs the code frozen in /root/cramlm-bridge/code (COMMIT names it), not the work tree others edit.
cd /work/main; . .venv/bin/activate; export CRAMLM_DATA_DIR=/work/shared/data HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export PYTHONPATH=/root/cramlm-bridge/code/src
exec taskset -c $1 python /root/cramlm-bridge/code/benchmarks/bridge.py long --line $2 --seed $3
