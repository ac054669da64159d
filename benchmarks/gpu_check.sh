#!/usr/bin/env bash
# The GPU check: everything cramlm does on CUDA, proven and measured in one command of
# at most 8 minutes on one GPU (an H200 with no network: carried wheels, no downloads).
#
#   bash benchmarks/gpu_check.sh          # on a GPU machine (after `bash benchmarks/gpu_wheels.sh` here)
#   bash benchmarks/gpu_check.sh --dry    # the same steps on a CPU, tiny sizes (CI runs it; ~3 min on 2 busy cores)
#
# Steps, in order, each under its own timeout (the whole stays under GPU_CHECK_SECONDS, default 470):
#   env        device, versions (installs the carried .whl/ wheels first when pydantic etc. are missing)
#   pytest     pytest -m cuda (tests/gpu: precision, kernels, inductor, resume, NCCL, FSDP2's sharded
#              checkpoints from the device, export; dry: the tests' CPU-capable part, CRAMLM_TEST_DEVICE=cpu,
#              the sharded checkpoints on gloo among them)
#   peak       measured bf16 GEMM rate: the peak every MFU below is computed against
#   model_step benchmarks/model_step.py tiny + base, bf16: crammed-bert vs HF BertForMaskedLM, MFU
#   train_step benchmarks/train_step.py tiny + base, bf16: the trainer's step vs a plain HF loop, MFU
#   pretrain   90 s of steady steps of `cramlm pretrain` of crammed-bert (base; the first step's compilation
#              off the clock, count_compile=false) on the shipped corpus (the 24 h
#              recipe's batch and microbatch, compile=auto): tokens/s and MFU from its summary
#   eval       `cramlm eval` of that run on the shipped task
#   ab         cramlm's GPU-day recipe (gpu-24h; and its fields with MLM) against crammed-bert-24h at equal
#              FLOPs, about a minute each: held-out loss, zero-shot minimal pairs (benchmarks/gpu_ab.py; GPU_CHECK_STEPS=ab)
#   extras     while time is left: model_step base with packed documents (FlexAttention vs the dense
#              mask), train_step base with --compile
# GPU_CHECK_STEPS=a,b runs only those steps (env and peak always run), e.g. a second call with
# GPU_CHECK_STEPS=model_step_documents,train_step_compile for the extras.
# Results: $OUT when set (the device tool brings it back), else benchmarks/results/gpu/local-<date>/
# (dry: ...-dry/, ignored by git): gpu_check.json (updated after every step, so a check cut short
# keeps what it measured), gpu_check.log, model_step.json, train_step.json, pretrain_metrics.jsonl,
# eval.json, ab.json (ab_prepare.log: the A/B data prepared in the background), model_step_documents.json, train_step_compile.json. The table printed last summarises them; exit status = number of steps not ok.
# See benchmarks/results/gpu/README.md for what to commit.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
DRY=0
for arg in "$@"; do
  case $arg in
    --dry) DRY=1 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "Error: unknown argument '$arg' (use --dry or nothing)" >&2; exit 2 ;;
  esac
done
PY=${PYTHON:-python3}
START=$(date +%s)
# the device lease runs one command for at most 8 minutes; --dry runs in CI on a shared 2-core machine,
# where a busy neighbour can make any step several times slower: its timeouts are 5x as long
SCALE=1; [ $DRY = 1 ] && SCALE=${GPU_CHECK_DRY_SCALE:-5}
LIMIT=${GPU_CHECK_SECONDS:-$((470 * SCALE))}
STAMP=$(date -u +%Y%m%d-%H%M%S)
if [ -n "${OUT:-}" ]; then RES=$OUT; elif [ $DRY = 1 ]; then RES=benchmarks/results/gpu/local-$STAMP-dry; else RES=benchmarks/results/gpu/local-$STAMP; fi
mkdir -p "$RES" && RES=$(cd "$RES" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/cramlm-gpu-check.XXXXXX")  # runs, data, checkpoints: never under $OUT
exec > >(tee -a "$RES/gpu_check.log") 2>&1
TEE_PID=$!
export PYTHONPATH="$REPO/src:$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export GPU_CHECK_DRY=$DRY GPU_CHECK_COMMIT=${GPU_CHECK_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
REPORT=("$PY" "$REPO/benchmarks/gpu_check_report.py")
echo "gpu_check: $([ $DRY = 1 ] && echo dry run on the CPU || echo GPU run), results in $RES, work in $WORK, ${LIMIT}s in all"

# want NAME: whether GPU_CHECK_STEPS (a comma list; unset: all) selects this step
want() { [ -z "${GPU_CHECK_STEPS:-}" ] || [[ ",$GPU_CHECK_STEPS," == *",$1,"* ]]; }

# run NAME TIMEOUT RESULT_FILE CMD...: one step under its timeout (shortened to the time left), recorded
run() {
  local name=$1 limit=$(($2 * SCALE)) file=$3 left t0 rc status
  shift 3
  left=$((LIMIT - ($(date +%s) - START)))
  if [ "$left" -lt 15 ]; then
    echo "=== $name: skipped, ${left}s left"; "${REPORT[@]}" step "$RES" "$name" skipped 0; return 1
  fi
  [ "$limit" -gt $((left - 10)) ] && limit=$((left - 10))
  echo "=== $name (timeout ${limit}s, $(( $(date +%s) - START ))s in) ==="
  t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@"
  rc=$?
  case $rc in 0) status=ok ;; 124|137) status=timeout ;; *) status="failed ($rc)" ;; esac
  "${REPORT[@]}" step "$RES" "$name" "$status" $(( $(date +%s) - t0 )) "$file"
  [ $rc = 0 ]
}

# --- env: the carried wheels (pydantic, omegaconf, filelock...) when this python lacks them
if ! "$PY" -c "import pydantic, omegaconf, filelock" 2>/dev/null; then
  if ls .whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$WORK/site" .whl/*.whl \
      && export PYTHONPATH="$WORK/site:$PYTHONPATH"
  else
    echo "Error: pydantic/omegaconf/filelock missing and no .whl/ here: run 'bash benchmarks/gpu_wheels.sh' where pip works, carry .whl"
  fi
  if ! "$PY" -c "import pydantic, omegaconf, filelock" 2>/dev/null; then  # every later step would fail at its imports
    echo "Error: pydantic/omegaconf/filelock still not importable after the carried wheels (.whl/: $(ls .whl 2>/dev/null | wc -l) files); nothing else runs"
    exit 1
  fi
fi
run env 60 "" "${REPORT[@]}" env "$RES" || { "${REPORT[@]}" table "$RES"; exit 1; }
if [ $DRY = 0 ]; then
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv
  if ! "$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
    echo "Error: torch sees no CUDA device; on a CPU use --dry"; "${REPORT[@]}" table "$RES"; exit 1
  fi
fi

# --- the A/B's data (the shared corpus, WordPiece 8192: ~1 minute of one CPU core), prepared in the background
# while the GPU steps run, niced and (with 8 CPUs or more) pinned to the last 4: into an ignored folder that a warm machine keeps
# between calls, so the A/B call (GPU_CHECK_STEPS=ab) finds it (dry: inside $WORK, the same path through the code)
AB_DATA=${CRAMLM_DATA_DIR:-$REPO/.gpu-data}
if [ $DRY = 1 ]; then AB_CACHE=$WORK/ab-data; else AB_CACHE=$REPO/.gpu-work/ab-data; fi
PREP_PID=
if want ab && { [ $DRY = 1 ] || [ -d "$AB_DATA/corpus" ]; } && ! ls "$AB_CACHE"/*/manifest.json >/dev/null 2>&1; then
  # the last 4 of the CPUs this process may use (a container's set need not start at 0), where there are 8 or more
  CPUS=$("$PY" -c 'import os; c = sorted(os.sched_getaffinity(0)); print(",".join(map(str, c[-4:])) if len(c) >= 8 else "")' 2>/dev/null)
  PIN=(); [ -n "$CPUS" ] && command -v taskset >/dev/null && PIN=(taskset -c "$CPUS")
  echo "ab data: preparing in the background into $AB_CACHE (log: ab_prepare.log; CPUs ${CPUS:-any}, nice 19)"
  ${PIN[@]+"${PIN[@]}"} nice -n 19 timeout --kill-after=10 $((240 * SCALE)) "$PY" benchmarks/gpu_ab.py --out "$WORK/ab-prepare" \
    --work "$WORK/ab-prepare" --data-dir "$AB_DATA" --data-cache "$AB_CACHE" --prepare $([ $DRY = 1 ] && echo --dry) \
    > "$RES/ab_prepare.log" 2>&1 &
  PREP_PID=$!
fi
# prep_wait S: wait up to S seconds for the background preparation (stopped after that: the A/B prepares
# its own), and say how it ended
prep_wait() {
  [ -n "$PREP_PID" ] || return 0
  local waited=0
  while kill -0 "$PREP_PID" 2>/dev/null && [ "$waited" -lt "$1" ]; do sleep 1; waited=$((waited + 1)); done
  kill -0 "$PREP_PID" 2>/dev/null && { echo "ab data: preparation stopped after ${1}s more"; kill "$PREP_PID"; }
  wait "$PREP_PID"
  echo "ab data: preparation ended (exit $?; ab_prepare.log)"
  PREP_PID=
}

# --- pytest -m cuda
# one line per test (a session cut short still shows how far it got); a test stuck past 100 s fails
# alone (pytest-timeout); four workers (pytest-xdist) compile their inductor kernels in parallel
PYTEST=(-o addopts= -v -rfEs -p no:cacheprovider --junitxml="$WORK/pytest.xml")
"$PY" -c "import pytest_timeout" 2>/dev/null && PYTEST+=(--timeout 100)
[ $DRY = 0 ] && "$PY" -c "import xdist" 2>/dev/null && PYTEST+=(-n 4)
# dry: CRAMLM_TEST_DEVICE=cpu runs the part of the tests' logic that holds on a CPU (the rest skips)
want pytest && run pytest 150 "$WORK/pytest.xml" env CRAMLM_TEST_DEVICE=$([ $DRY = 1 ] && echo cpu) "$PY" -m pytest -m cuda tests/gpu "${PYTEST[@]}"

# --- peak: the bf16 GEMM rate (dry: the CPU's fp32 probe); every MFU below is against it
T0=$(date +%s)
PEAK=$(timeout $((60 * SCALE)) "${REPORT[@]}" peak "$RES" | tail -1)
if [[ $PEAK =~ ^[0-9.]+(e[+-]?[0-9]+)?$ ]]; then STATUS=ok; else STATUS=failed; PEAK=1e15; fi  # failed: MFU vs 1 PFLOP/s
"${REPORT[@]}" step "$RES" peak $STATUS $(( $(date +%s) - T0 ))
echo "peak: $PEAK FLOP/s"

# --- model_step and train_step
if [ $DRY = 1 ]; then
  want model_step && run model_step 120 "$RES/model_step.json" "$PY" benchmarks/model_step.py --sizes tiny --batch 2 --seq 16 --steps 1 \
    --warmup 0 --precision fp32 --peak-flops "$PEAK" --json "$RES/model_step.json"
  want train_step && run train_step 120 "$RES/train_step.json" "$PY" benchmarks/train_step.py --sizes tiny --microbatch 2 --steps 1 \
    --warmup 0 --vocab 512 --peak-flops "$PEAK" --out "$RES/train_step.json"
else
  want model_step && run model_step 75 "$RES/model_step.json" "$PY" benchmarks/model_step.py --sizes tiny base --batch 128 --steps 10 --count-ops \
    --warmup 3 --precision bf16 --peak-flops "$PEAK" --json "$RES/model_step.json"
  want train_step && run train_step 80 "$RES/train_step.json" "$PY" benchmarks/train_step.py --sizes tiny base --microbatch 128 128 \
    --steps 5 --warmup 2 --precision bf16 --profile --peak-flops "$PEAK" --out "$RES/train_step.json"
fi

# --- pretrain: crammed-bert on the shipped corpus, the 24 h recipe's batch (8192 = 64 x 128, no ramp)
RUN=$WORK/runs/gpu-check
COMMON=(name=gpu-check "base_dir=$WORK/runs" "impl.data_cache=$WORK/data" impl.progress=false data=default)
if [ $DRY = 1 ]; then
  PRETRAIN=(arch=crammed-bert-tiny arch.hidden_size=32 arch.num_layers=2 arch.num_heads=2 arch.intermediate_size=64
            arch.max_seq_length=32 data.seq_length=32 data.tokenizer.vocab_size=512 data.max_entries_in_raw_dataset=20
            train.batch_size=8 impl.microbatch_size=8 budget=null train.budget.steps=4)
  PRETRAIN_TIMEOUT=120
else
  left=$((LIMIT - ($(date +%s) - START)))
  # the budget counts steady steps only (count_compile=false: the first step, which compiles, is off the
  # clock); leave time for setup, that first step, the final validation (an eval-mode compile), the last
  # checkpoint and eval
  SECONDS_BUDGET=$(( left - 170 < 90 ? left - 170 : 90 ))
  [ $SECONDS_BUDGET -lt 20 ] && SECONDS_BUDGET=20
  PRETRAIN=(arch=crammed-bert train=bert-o4 data.tokenizer.vocab_size=32768 "budget=${SECONDS_BUDGET}s" count_compile=false
            impl.microbatch_size=128 train.batch_size=8192 train.batch_ramp=0 train.min_updates=0 train.log_every=1
            train.validate_every=0 train.checkpoint_minutes=null)  # validation (and its eval-mode compile) only after the budget
  PRETRAIN_TIMEOUT=$((SECONDS_BUDGET + 140))
fi
# its metrics reach $RES every 10 s while it runs: a call cut short by the device's own limit keeps its steps
( while sleep 10; do [ -f "$RUN/metrics.jsonl" ] && cp "$RUN/metrics.jsonl" "$RES/pretrain_metrics.jsonl"; done ) >/dev/null 2>&1 &
COPIER=$!
if want pretrain && run pretrain "$PRETRAIN_TIMEOUT" "" "$PY" -m cramlm pretrain "${COMMON[@]}" "${PRETRAIN[@]}"; then
  kill $COPIER 2>/dev/null
  cp "$RUN/metrics.jsonl" "$RES/pretrain_metrics.jsonl"
  "${REPORT[@]}" pretrain "$RES" "$RUN"
  # --- eval on the shipped task (GLUE-sane's lr 4e-5 suits a base-size model)
  if [ $DRY = 1 ]; then EVAL=(eval.epochs=1 eval.max_train_examples=32 eval.max_dev_examples=32)
  else EVAL=(eval.lr=4e-5 eval.epochs=2); fi
  want eval && run eval 60 "$RUN/eval.json" "$PY" -m cramlm eval "checkpoint=$RUN" impl.progress=false "${EVAL[@]}"
  cp "$RUN/eval.json" "$RES/eval.json" 2>/dev/null
else
  kill $COPIER 2>/dev/null
  # cut short (a timeout): the steady rate from the steps it logged
  cp "$RUN/metrics.jsonl" "$RES/pretrain_metrics.jsonl" 2>/dev/null && "${REPORT[@]}" pretrain "$RES" "$RUN"
fi

# --- ab: cramlm's GPU-day recipe against cramming's at equal FLOPs (benchmarks/gpu_ab.py); on the GPU
# only when selected (GPU_CHECK_STEPS=ab) or when 300 s are left; the shared corpus and minimal pairs
# come from $CRAMLM_DATA_DIR, else the carried .gpu-data/ (benchmarks/results/gpu/README.md); the data prepared
# above (this call's background, or the first call's) is waited for
if want ab && { [ $DRY = 1 ] || [ -n "${GPU_CHECK_STEPS:-}" ] || [ $((LIMIT - ($(date +%s) - START))) -gt 300 ]; }; then
  [ -n "$PREP_PID" ] && echo "ab data: waiting for the preparation"
  prep_wait $((240 * SCALE))
  AB=(--out "$RES" --work "$WORK/ab" --data-dir "$AB_DATA" --data-cache "$AB_CACHE")
  if [ $DRY = 1 ]; then AB+=(--dry --pairs "$REPO/tests/eval/fixtures/minimal_pairs"); elif [ -d "$AB_DATA/minimal_pairs/blimp" ]; then AB+=(--pairs "$AB_DATA/minimal_pairs/blimp"); fi
  run ab 300 "$RES/ab.json" "$PY" benchmarks/gpu_ab.py "${AB[@]}"
fi

# --- extras, while time is left (each compiles kernels first, so each needs a minute or more):
# packed documents through FlexAttention against the dense mask, then the trainer's step compiled
# (what compile=auto buys at base size)
if [ $DRY = 0 ] && want model_step_documents && [ $((LIMIT - ($(date +%s) - START))) -gt 75 ]; then
  run model_step_documents 90 "$RES/model_step_documents.json" "$PY" benchmarks/model_step.py --sizes base --batch 128 \
    --steps 5 --warmup 2 --precision bf16 --documents 4 --peak-flops "$PEAK" --json "$RES/model_step_documents.json"
fi
if [ $DRY = 0 ] && want train_step_compile && [ $((LIMIT - ($(date +%s) - START))) -gt 75 ]; then
  run train_step_compile 90 "$RES/train_step_compile.json" "$PY" benchmarks/train_step.py --sizes base --microbatch 128 \
    --steps 5 --warmup 2 --precision bf16 --compile --peak-flops "$PEAK" --out "$RES/train_step_compile.json"
fi

prep_wait 30  # a preparation still running works in $WORK: it ends (or stops) before $WORK goes
rm -rf "$WORK"
echo "gpu_check: $(( $(date +%s) - START ))s"
"${REPORT[@]}" table "$RES"
status=$?
exec >&- 2>&-  # close the log pipe, so that tee has written everything when the script ends
wait "$TEE_PID" 2>/dev/null
exit $status
