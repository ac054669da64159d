#!/usr/bin/env bash
# bash queue.sh CORE: runs the lines of /root/cramlm-bridge/queue-CORE.txt in order, each pinned to
# CORE, with the venv and the offline environment; '#' lines are notes. A line that ends with exit 0 is
# moved to done-CORE.txt; any other exit stops the queue and keeps the line first (a run stopped by
# SIGTERM exits 75 and continues from its checkpoint when the queue is started again: every bridge
# command is idempotent). The file is read anew before each line, so it may be edited at any time.
B=/root/cramlm-bridge core=$1 q=/root/cramlm-bridge/queue-$1.txt
cd /work/main && . .venv/bin/activate || exit 1
export B CRAMLM_DATA_DIR=/work/shared/data HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
while line=$(grep -v '^[[:space:]]*#' "$q" | grep -m1 '[^[:space:]]'); do
  echo "### $(date '+%F %T') core $core: $line"
  taskset -c "$core" bash -c "$line"
  rc=$?
  if [ $rc != 0 ]; then echo "### $(date '+%F %T') core $core: stopped (exit $rc); the line stays first"; exit $rc; fi
  awk -v l="$line" '!d && $0 == l {d = 1; next} 1' "$q" > "$q.tmp" && mv "$q.tmp" "$q"
  echo "$(date '+%F %T') $line" >> "$B/done-$core.txt"
done
echo "### $(date '+%F %T') core $core: queue empty"
