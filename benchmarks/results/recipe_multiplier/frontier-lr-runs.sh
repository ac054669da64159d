#!/bin/bash
# usage: frontier.sh CORE NAME SIZE FLOPS LR
cd /work/main && . .venv/bin/activate
export CRAMLM_DATA_DIR=../shared/data HF_HUB_OFFLINE=1
core=$1; name=$2; size=$3; flops=$4; lr=$5
case $size in
  128x4) S="arch.hidden_size=128 arch.num_layers=4 arch.num_heads=4 arch.intermediate_size=512";;
  256x4) S="arch.hidden_size=256 arch.num_layers=4 arch.num_heads=4 arch.intermediate_size=1024";;
  384x6) S="arch.hidden_size=384 arch.num_layers=6 arch.num_heads=6 arch.intermediate_size=1536";;
esac
taskset -c $core cramlm run cpu-1h-mlm base_dir=outputs/frontier-lr impl.progress=false "stages=[data,pretrain]" \
  train.validate_every=0.1 impl.data_cache=outputs/r25-mlm-data impl.threads=1 $S budget=null train.budget.flops=$flops \
  train.optim.type=adamw arch.qk_norm=false arch.zero_init_out=false train.optim.lr=$lr seed=0 name=$name \
  > outputs/frontier-lr-$name.log 2>&1
echo "$name rc=$?" >> outputs/frontier-lr-done.txt
