#!/usr/bin/env bash
# one line's branches and evaluations in order: bash chain.sh LINE SEED K...
# Runs the code frozen in /root/cramlm-bridge/code (COMMIT names it), not the work tree others edit.
cd /work/main; . .venv/bin/activate; export CRAMLM_DATA_DIR=/work/shared/data HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export PYTHONPATH=/root/cramlm-bridge/code/src
bridge=/root/cramlm-bridge/code/benchmarks/bridge.py
line=$1 seed=$2; shift 2
for k in "$@"; do
  python $bridge branch --line $line --seed $seed --k $k || exit 1
  python $bridge eval --line $line --seed $seed --k $k || exit 1
  if [ $k = 1 ]; then python $bridge eval --line $line --seed $seed --k 1 --twin || exit 1; fi
done
