#!/usr/bin/env bash
# The recall grid (studies/recall/sweep.py) on one GPU: many runs at once, each its own
# `train.sweep` process, so that the GPU, idle between one small model's kernels, runs the
# others'. Runs the same configs as the CPU grid, at the same budget; only the device differs
# (results.json's 'device' names it).
#
#   OUT=folder bash studies/recall/gpu/run.sh RUN...  RUN = seed:mechanism:width:cell[:settings]
#   OUT=folder bash studies/recall/gpu/run.sh 0:softmax:128:256x16 1:gla:128:256x16
#   OUT=folder bash studies/recall/gpu/run.sh 0:linear+local:64:128x8:feature_map=taylor;window=64
#
# settings: more sweep settings of that run, key=value joined by ';' (quote the run in a
# shell). `python -m studies.recall.report --missing` prints the runs the study lacks so.
#
# Settings (environment): ROOT (workdirs, default /tmp/recall: $ROOT/seed<s>/<name>, as the
# CPU grid's roots), WORKERS (runs at once, default the machine's CPU count: each run's host
# loop needs a core; on an H200 with 16 cores, 13 at once kept the GPU at 100%),
# AUTOTUNE (XLA's GPU autotuning level, 0-4, default 0: off; on an H100, 14 runs at once with
# it on spent 7-8 minutes compiling at a load average near 200 before their first steps, and
# with it off 13 runs on an H200 were training within about a minute; the empty string leaves
# XLA's default; results agree with the CPU's either way), BUDGET_S (seconds this call waits,
# default 540: runs still going then are left running, detached, and the same command
# called again on the same machine waits for them instead of starting them again; a run
# stopped early resumes from its last checkpoint), PRECISION (jax_default_matmul_precision,
# default 'highest': float32 matmuls in float32, as on a CPU, not in TF32), SWEEP_ARGS
# (more sweep settings, e.g. ',learning_rate=3e-3'). JAX's persistent compilation cache
# ($ROOT/jax_cache unless JAX_COMPILATION_CACHE_DIR is set) lets a run reuse what another
# run of the same program (another seed) compiled.
#
# Where the machine's image lacks a package: wheels in .whl/ (the versions of
# requirements.txt) are installed into /tmp/site; where TensorFlow is missing,
# studies/recall/gpu/sitecustomize.py lets clu import (TensorBoard events through PyTorch).
# Results: $OUT/recall_gpu.tgz (each finished run's config.json, results.json and
# metrics.jsonl under seed<s>/<name>/, unfinished runs' under partial/, every run's log
# under logs/) and $OUT/log.txt, packed every 30 s and at the end. Unpack into a folder and
# pass its 'seed*' to studies.recall.report beside the CPU roots.
set -u
cd "$(dirname "$0")/../../.." || exit 1
: "${OUT:?set OUT to the folder the results go to}"
if (( $# == 0 )); then
  echo "usage: OUT=folder bash studies/recall/gpu/run.sh seed:mechanism:width:cell ..." >&2
  exit 2
fi
ROOT=${ROOT:-/tmp/recall}
WORKERS=${WORKERS:-$(nproc)}
AUTOTUNE=${AUTOTUNE-0}
if ! [[ -z "$AUTOTUNE" || "$AUTOTUNE" =~ ^[0-4]$ ]]; then
  echo "run.sh: AUTOTUNE='$AUTOTUNE' is not valid; write a level 0-4 (0: off, the default)" \
       "or the empty string (XLA's default)" >&2
  exit 2
fi
[[ -n "$AUTOTUNE" ]] && export XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_gpu_autotune_level=$AUTOTUNE"
BUDGET=${BUDGET_S:-540}
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export JAX_DEFAULT_MATMUL_PRECISION=${PRECISION:-highest}
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$ROOT/jax_cache}
SETTING='[a-z_]+=[a-z0-9._-]+'
for run in "$@"; do  # seed:mechanism:width:cell[:settings], checked before anything starts
  IFS=: read -r s m w c o <<< "$run"
  if ! [[ "$s" =~ ^[0-9]+$ && "$m" =~ ^[a-z0-9_]+(\+[a-z0-9_]+)*$ && "$w" =~ ^[0-9]+$
          && "$c" =~ ^[0-9]+x[0-9]+$ && ( -z "$o" || "$o" =~ ^$SETTING(\;$SETTING)*$ ) ]]; then
    echo "run.sh: run '$run' is not valid; write seed:mechanism:width:cell[:settings], e.g." \
         "0:softmax:128:256x16 or 0:linear+local:64:128x8:feature_map=taylor;window=64" >&2
    exit 2
  fi
done

mkdir -p "$OUT" "$ROOT/logs" "$ROOT/pids"
LOG=$OUT/log.txt
: > "$LOG"
START=$(date +%s)
log() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - START ))s] $*" | tee -a "$LOG"; }
log "WORKERS=$WORKERS, XLA_FLAGS='${XLA_FLAGS:-}'"

# 1. Packages: the pinned wheels, else the image's own flax/optax/orbax with the carried rest.
check() {
  "$PY" -c "
import jax, flax, optax, orbax.checkpoint, ml_collections, clu
from clu import metric_writers, periodic_actions
from train import trainer
print('jax', jax.__version__, jax.default_backend(), jax.devices(), 'precision',
      jax.config.jax_default_matmul_precision, '| flax', flax.__version__, '| optax',
      optax.__version__, '| orbax', orbax.checkpoint.__version__)" 2>&1 | tail -3 | tee -a "$LOG"
  return "${PIPESTATUS[0]}"
}
install() {  # install WHEEL...: into a fresh /tmp/site
  rm -rf /tmp/site
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$@"
}
export PYTHONPATH=studies/recall/gpu
if compgen -G ".whl/*.whl" > /dev/null; then
  install .whl/*.whl
  export PYTHONPATH=studies/recall/gpu:/tmp/site
fi
if ! check; then
  log "the pinned wheels do not import; trying the image's flax, optax and orbax"
  install .whl/ml_collections-*.whl .whl/clu-*.whl
  check || { log "no working set of packages: stopping"; exit 1; }
fi
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version \
  --format=csv,noheader | tee -a "$LOG"

# 2. The data of each run, written once before the runs start (they would race), from the
#    runs' own configs, and a fingerprint of each test split to compare with another machine's;
#    each run's workdir name as the sweep gives it (SWEEP_ARGS may add to it) into names.tsv.
spec() { IFS=: read -r s m w c o <<< "$1"
  local own=${o:+,${o//;/,}}  # the run's own settings, ';' between them
  echo "studies/recall/sweep.py:seed=$s,mechanisms=$m,widths=$w,cells=$c$own${SWEEP_ARGS:-}"; }
specs=(); for run in "$@"; do specs+=("$(spec "$run")"); done
"$PY" -c "
import hashlib, sys
import numpy as np
from data import generated
from train import sweep
seen = set()
names = open(sys.argv[1], 'w')
for spec in sys.argv[2:]:
  try:
    runs = sweep.expand(sweep.load_sweep(spec))
    names.write(f'{spec}\t{runs[0].name}\n')
    configs = [sweep.build_config(run) for run in runs]
  except ValueError as e:  # a bad run fails again, with this message, when it is started
    print(f'{spec}: {e}')
    continue
  for config in configs:
    pattern = generated.ensure(config, verbose=False)
    if pattern not in seen:
      seen.add(pattern)
      with np.load(pattern.format(split='test')) as d:
        digest = hashlib.sha256(d['inputs'].tobytes() + d['labels'].tobytes()).hexdigest()
      print(pattern.format(split='test'), 'sha256 of inputs+labels', digest)
" "$ROOT/names.tsv" "${specs[@]}" 2>&1 | grep -v '^[IW]0000\|^WARNING: All log' | tee -a "$LOG"

# 3. A smoke run: four steps of a tiny model, the whole path (data, trainer, writers,
#    checkpoints) on this device; once per ROOT (a later call finds its results).
if [[ -f $ROOT/smoke/results.json ]]; then
  log "smoke run: passed earlier on this machine"
elif ! rm -rf "$ROOT/smoke" || ! timeout 300 "$PY" main.py --workdir="$ROOT/smoke" --config=configs/mqar.py:softmax,d_model=16,seq_len=32,num_kv_pairs=2,vocab_size=64,num_train=256,num_steps=4 \
    > "$ROOT/logs/smoke.log" 2>&1; then
  tail -20 "$ROOT/logs/smoke.log" | tee -a "$LOG"
  log "the smoke run failed: stopping"
  exit 1
else
  log "smoke run: $(grep 'test accuracy' "$ROOT/logs/smoke.log")"
fi

# 4. The runs, WORKERS at a time, in the order given.
key() {  # seed<s>/<the sweep's name of the run>; a run the sweep refused: the grid's naming
  local sp name; sp=$(spec "$1"); IFS=: read -r s m w c o <<< "$1"
  name=$(awk -F'\t' -v sp="$sp" '$1 == sp {print $2}' "$ROOT/names.tsv" 2> /dev/null)
  echo "seed$s/${name:-$m-d$w-l${c%x*}-kv${c#*x}}"
}
alive() { local f="$ROOT/pids/${1//\//_}"; [[ -f $f ]] && kill -0 "$(cat "$f")" 2> /dev/null; }
done_() { [[ -f "$ROOT/$1/results.json" ]]; }
pack() {
  local pk=/tmp/recall_pack
  rm -rf "$pk"; mkdir -p "$pk/logs"
  for wd in "$ROOT"/seed*/*/; do
    local k=${wd%/}; k=${k#"$ROOT"/}
    local dest=$pk/$k
    [[ -f "$wd/results.json" ]] || dest=$pk/partial/${k//\//_}
    mkdir -p "$dest"
    cp "$wd"/config.json "$wd"/results.json "$wd"/metrics.jsonl "$dest"/ 2> /dev/null
  done
  cp "$ROOT"/logs/*.log "$pk/logs/" 2> /dev/null
  tar czf "$OUT/recall_gpu.tgz" -C "$pk" .
}
declare -A tried
last_pack=0
while true; do
  running=0 left=0
  for run in "$@"; do
    k=$(key "$run")
    if done_ "$k"; then continue; fi
    if alive "$k"; then running=$((running + 1)); continue; fi
    if [[ -n "${tried[$k]:-}" ]]; then
      if [[ "${tried[$k]}" == launched ]]; then
        log "FAILED $k (no results.json): $(tail -3 "$ROOT/logs/${k//\//_}.log" | tr '\n' ' ')"
        tried[$k]=failed
      fi
      continue
    fi
    left=$((left + 1))
  done
  for run in "$@"; do
    (( running < WORKERS )) || break
    k=$(key "$run")
    if done_ "$k" || alive "$k" || [[ -n "${tried[$k]:-}" ]]; then continue; fi
    IFS=: read -r s _ _ _ <<< "$run"
    setsid "$PY" -m train.sweep \
      --sweep="$(spec "$run")" \
      --root="$ROOT/seed$s" run >> "$ROOT/logs/${k//\//_}.log" 2>&1 < /dev/null &
    echo $! > "$ROOT/pids/${k//\//_}"
    tried[$k]=launched
    running=$((running + 1)); left=$((left - 1))
    log "START $k"
  done
  now=$(date +%s)
  if (( now - last_pack >= 30 )); then
    n=0; for run in "$@"; do done_ "$(key "$run")" && n=$((n + 1)); done
    log "$n of $# done, $running running$(command -v nvidia-smi > /dev/null && nvidia-smi \
      --query-gpu=utilization.gpu,memory.used --format=csv,noheader | sed 's/^/; GPU /')"
    pack; last_pack=$now
  fi
  if (( running == 0 && left == 0 )); then log "nothing left to run"; break; fi
  if (( now - START >= BUDGET )); then
    log "budget of $BUDGET s spent: $running runs left running (call again to wait for them)"
    break
  fi
  sleep 5
done
pack
for run in "$@"; do
  k=$(key "$run")
  if done_ "$k"; then
    log "DONE $k: $("$PY" -c "import json,sys; r=json.load(open(sys.argv[1])); print(
      f\"test {100 * r['eval_accuracy']:.2f}%, {r['steady_examples_per_sec']:.0f} ex/s, \"
      f\"{r['wall_time_s']:.0f} s, {r.get('device')}\")" "$ROOT/$k/results.json")"
  else
    log "NOT DONE $k: $(grep -o 'step [0-9]*/[0-9]*' "$ROOT/logs/${k//\//_}.log" | tail -1)"
  fi
done
