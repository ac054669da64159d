#!/bin/bash
# usage: run1.sh CORE NAME SIZE FLOPS OVERRIDES...   (muon-full or anything: overrides given in full)
cd /work/main && . .venv/bin/activate
export CRAMLM_DATA_DIR=../shared/data HF_HUB_OFFLINE=1
core=$1; name=$2; size=$3; flops=$4; shift 4
case $size in
  128x4) S="arch.hidden_size=128 arch.num_layers=4 arch.num_heads=4 arch.intermediate_size=512";;
  256x4) S="arch.hidden_size=256 arch.num_layers=4 arch.num_heads=4 arch.intermediate_size=1024";;
  384x6) S="arch.hidden_size=384 arch.num_layers=6 arch.num_heads=6 arch.intermediate_size=1536";;
esac
taskset -c $core cramlm run ${RECIPE:-cpu-1h-mlm} base_dir=outputs/screen impl.progress=false "stages=[data,pretrain]" \
  train.validate_every=0.1 impl.data_cache=${DATA:-outputs/r25-mlm-data} impl.threads=1 $S budget=null train.budget.flops=$flops \
  "$@" name=$name > outputs/screen-$name.log 2>&1
echo "$name rc=$?" >> outputs/screen-done.txt
