#!/usr/bin/env bash
# one line's branches and evaluations in order: bash chain.sh LINE SEED K...
cd /work/main; . .venv/bin/activate; export CRAMLM_DATA_DIR=/work/shared/data HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
line=$1 seed=$2; shift 2
for k in "$@"; do
  python benchmarks/bridge.py branch --line $line --seed $seed --k $k || exit 1
  python benchmarks/bridge.py eval --line $line --seed $seed --k $k || exit 1
  [ $k = 1 ] && { python benchmarks/bridge.py eval --line $line --seed $seed --k 1 --twin || exit 1; }
done
