#!/usr/bin/env bash
# bash core.sh CORE LINE SEED K...: one core's queue: that line's branches and evaluations at K...
# (chain.sh), then its long run (lane.sh), everything pinned to CORE: two queues, two cores.
core=$1 line=$2 seed=$3; shift 3
[ $# -gt 0 ] && { taskset -c $core bash /root/cramlm-bridge/chain.sh $line $seed "$@" >> /root/cramlm-bridge/chain-$line-s$seed.log 2>&1 || exit 1; }
exec bash /root/cramlm-bridge/lane.sh $core $line $seed >> /root/cramlm-bridge/lane-$line-s$seed.log 2>&1
