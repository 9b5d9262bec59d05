#!/usr/bin/env bash
# The GPU tables from one script: its parts in priority order inside one wall budget
# (BUDGET_S, default 390 s: 6.5 minutes, compiles included), each under its own `timeout`, so
# a hang costs that part only and the last parts are the ones cut; what the budget leaves out
# runs in a second call with PARTS (below). By default only the parts not yet measured on a
# GPU run (PARTS unset: "nvidia_smi env fla_peer fla_peer_2025 fla_peer_long fla_peer_paper");
# PARTS=all runs every part.
#
#   OUT=/some/folder bash benchmarks/gpu_suite.sh            # on the GPU
#   OUT=/tmp/gpu_smoke PARTS=all bash benchmarks/gpu_suite.sh --smoke
#                                                      # every part at tiny sizes, on CPU
#   PARTS="peers_bfloat16_4096 peers_bfloat16_8192 flash_bfloat16 flash_causal" \
#     OUT=... bash benchmarks/gpu_suite.sh
#                                                      # only these parts (a second call)
#
# Parts, in order:
#   nvidia_smi, env     the device, jax, and that no ml_collections/clu/tensorflow is imported;
#   fla_peer            benchmarks.fla_peer (docs/results/gated_gpu.md): the five older
#                       recurrences' chunk forms (retention, mamba2, gla, deltanet,
#                       gated_deltanet), ours (XLA and Pallas, bfloat16 and float32) against fla's
#                       Triton kernels (bfloat16; benchmarks/published/third_party/fla carried,
#                       hash-checked), forward + backward, batch 4, 16 heads of 128, 4K and 16K,
#                       and decoding latency per token;
#   fla_peer_2025       the same for kda, gated_deltaproduct and rwkv7 (gated_gpu_2025.md;
#                       rwkv7 has no Pallas kernel: those cells say so);
#   fla_peer_long       the five older ones at 64K tokens, batch 1, bfloat16;
#   fla_peer_paper      the papers' head layouts (Mamba-2 ngroups=1, Gated DeltaNet 256/512);
#   flash_float32       dense `jax.nn.dot_product_attention` (XLA) vs softmax_chunked with
#                       implementation=xla and =pallas, forward + backward, batch 4, 8 heads of
#                       64, 1K/4K/16K, as docs/results/flash_gpu.md;
#   flash_precision     each exact implementation's error against float64 (default and 'highest'
#                       matmul precision), the 'highest' times and two other kernel block sizes;
#   peers_float32_4096, peers_float32_8192
#                       benchmarks.peers, as docs/results/peers_gpu.md, one length per part (the
#                       published FAVOR+ pairs need benchmarks/published/third_party carried);
#   gated               docs/results/gated_linear_speed.md's targets and comparisons at 1K, 4K,
#                       16K (exponent over 4K-16K; a scan predicted over 1.5 s a call skipped;
#                       interleaved by length, every point's line in the log if it is cut);
#   peers_bfloat16_4096, peers_bfloat16_8192, flash_bfloat16 (exact = cuDNN),
#   flash_causal (float32, 4K, 16K).
# From the compile times of earlier H100 runs (0.2-8 s a program), the parts up to
# fla_peer_2025 fill the budget (fla_peer_long and fla_peer_paper may be cut); the rest are for
# a second call (PARTS=..., below).
# Results: one folder, packed after every part into $OUT/gpu_results.tgz (each part's output in
# <part>.log, each tool's .md/.json/.png); the timestamped progress, with every part's output,
# in $OUT/log.txt.
set -u
cd "$(dirname "$0")/.." || exit 1

SMOKE=0
if [[ "${1:-}" == "--smoke" ]]; then SMOKE=1; elif [[ $# -gt 0 ]]; then
  echo "usage: OUT=folder bash benchmarks/gpu_suite.sh [--smoke]" >&2; exit 2; fi
PARTS=${PARTS-"nvidia_smi env fla_peer fla_peer_2025 fla_peer_long fla_peer_paper"}
[[ "$PARTS" == all ]] && PARTS=''
: "${OUT:?set OUT to the folder the results go to}"
mkdir -p "$OUT"
RES=$(mktemp -d)/gpu_results   # outside $OUT: only the tarball and the log come back
mkdir -p "$RES"
LOG=$OUT/log.txt
: > "$LOG"
export PYTHONUNBUFFERED=1
if [[ -n "${PYTHON:-}" ]]; then PY=$PYTHON
elif [[ -x .venv/bin/python ]]; then PY=.venv/bin/python
else PY=$(command -v python || command -v python3); fi
START=$(date +%s)
BUDGET=${BUDGET_S:-$(( SMOKE ? 900 : 390 ))}  # the smoke run on a loaded CPU needs more

log() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - START ))s] $*" | tee -a "$LOG"; }

# part NAME LIMIT_S CMD...: CMD under `timeout` of min(LIMIT_S, what the budget has left - 15 s),
# its output in $RES/NAME.log and the log; a part with under 20 s left is skipped, and so is
# one not named in $PARTS when that is set (e.g. PARTS="flash_bfloat16 flash_causal").
part() {
  local name=$1 limit=$2; shift 2
  if [[ -n "${PARTS:-}" && " $PARTS " != *" $name "* ]]; then return; fi
  local left=$(( BUDGET - ($(date +%s) - START) - 15 ))
  (( left < limit )) && limit=$left
  if (( limit < 20 )); then log "SKIP $name: ${left} s of the budget left"; return; fi
  log "START $name (timeout ${limit} s): $*"
  timeout -k 5 "$limit" "$@" 2>&1 | tee "$RES/$name.log" >> "$LOG"
  local rc=${PIPESTATUS[0]}
  log "END $name: exit $rc$( ((rc == 124 || rc == 137)) && echo ' (timed out)')"
  tar czf "$OUT/gpu_results.tgz" -C "$RES" .
}

if (( SMOKE )); then
  FLASH_LENGTHS=64,128; CAUSAL_LENGTHS=64; PEER_LENGTHS=64; GATED_LENGTHS=32
  GATED_MECHANISMS=(retention); GATED_FIT=32,64
  REPEATS=2; BATCH=1; HEADS=2; HEAD_DIM=16; EXACT16=xla
  PRECISION=(--length=32 --heads=2 --head_dim=16 --dtypes=float32
             --implementations=dense,pallas --time_length=32 --time_batch=1 --repeats=2
             --pallas_blocks=16,16,16,16,16,16)
  PEER_EXTRA=(--heads=2 --head_dim=16 --features=16 --landmarks=8 --k_proj=8
              --pairs=softmax_chunked,linear)
  HEAD_FLAGS=(--heads=2 --head_dim=16)
  LIMIT=120
  FLA_FLAGS=(--dry_run --recurrences=retention,gated_deltanet)
  FLA_2025=(--dry_run --recurrences=kda,gated_deltaproduct,rwkv7 --dtypes=float32 --nodecode)
  FLA_LONG=(--dry_run --recurrences=gla --dtypes=bfloat16 --nodecode)
  FLA_PAPER=(--dry_run --layouts=paper --recurrences=gated_deltanet --nodecode)
else
  FLA_OLDER=--recurrences=retention,mamba2,gla,deltanet,gated_deltanet
  FLA_FLAGS=(--lengths=4096,16384 --layouts=heads --repeats=5 --budget_s=5 $FLA_OLDER)
  FLA_2025=(--lengths=4096,16384 --layouts=heads --repeats=5 --budget_s=5
            --recurrences=kda,gated_deltaproduct,rwkv7)
  FLA_LONG=(--lengths=65536 --layouts=heads --dtypes=bfloat16 --repeats=3 --budget_s=5
            --nodecode $FLA_OLDER)
  FLA_PAPER=(--lengths=4096,16384 --layouts=paper --recurrences=mamba2,gated_deltanet
             --dtypes=bfloat16 --repeats=5 --budget_s=5 --nodecode)
  FLASH_LENGTHS=1024,4096,16384; CAUSAL_LENGTHS=4096,16384; PEER_LENGTHS=4096,8192
  GATED_LENGTHS=1024,4096,16384; GATED_MECHANISMS=(retention gla mamba2 deltanet gated_deltanet)
  GATED_FIT=4096,16384
  REPEATS=10; BATCH=4; HEADS=8; HEAD_DIM=64; EXACT16=cudnn
  PRECISION=(--length=2048 --causal=false --time_length=4096 --time_batch=4
             --time_precisions=highest --repeats=10
             --pallas_blocks=64,64,32,32,32,32 --pallas_blocks=128,128,64,64,64,64)
  PEER_EXTRA=()
  HEAD_FLAGS=()
  LIMIT=0  # 0: each part's own limit below
fi
lim() { if (( LIMIT )); then echo "$LIMIT"; else echo "$1"; fi; }
HAS_PEER_DTYPE=0
grep -q "DEFINE_enum('dtype'" benchmarks/peers.py && HAS_PEER_DTYPE=1

log "gpu_suite: smoke=$SMOKE python=$PY budget=${BUDGET} s results=$RES"

# 1. The machine.
part nvidia_smi 20 nvidia-smi
part env "$(lim 40)" "$PY" -c "
import os, sys
import jax
print('jax', jax.__version__, 'backend', jax.default_backend(), 'devices', jax.devices())
import benchmarks.flash_precision, benchmarks.peers, benchmarks.published, benchmarks.speed
import benchmarks.fla_peer, benchmarks.published.fla
print('fla:', benchmarks.published.fla.why_missing() or 'ready')
heavy = [m for m in ('ml_collections', 'clu', 'tensorflow', 'tensorflow_datasets')
         if m in sys.modules]
print('of ml_collections, clu, tensorflow, tensorflow_datasets imported:', heavy or 'none')
path = benchmarks.published.fast_attention_path()
print('published FAVOR+ file', path, 'present' if os.path.exists(path) else 'ABSENT')
sys.exit(1 if heavy else 0)"

# 1b. The gated family against fla (issue 61): the first tables a GPU has not measured yet.
part fla_peer "$(lim 240)" "$PY" -m benchmarks.fla_peer "${FLA_FLAGS[@]}" --out="$RES" \
  --name=gated_gpu
part fla_peer_2025 "$(lim 150)" "$PY" -m benchmarks.fla_peer "${FLA_2025[@]}" --out="$RES" \
  --name=gated_gpu_2025
part fla_peer_long "$(lim 120)" "$PY" -m benchmarks.fla_peer "${FLA_LONG[@]}" --out="$RES" \
  --name=gated_gpu_64k
part fla_peer_paper "$(lim 90)" "$PY" -m benchmarks.fla_peer "${FLA_PAPER[@]}" --out="$RES" \
  --name=gated_gpu_paper

flash_cmd() {  # flash_cmd DTYPE EXACT_IMPLEMENTATION NAME LENGTHS [more flags]: sets CMD
  local pallas=softmax_chunked@implementation=pallas xla=softmax_chunked@implementation=xla
  CMD=("$PY" -m benchmarks.speed --targets=exact,$xla,$pallas --layers= --lengths="$4"
       --modes=fwd_bwd --dtype="$1" --batch=$BATCH --heads=$HEADS --head_dim=$HEAD_DIM
       --repeats=$REPEATS --order=length --exact_implementation="$2"
       --compare=$pallas:exact --compare=$xla:exact --compare=$pallas:$xla
       --time_budget_s=4 --max_time_s=3 --memory_budget_gb=40 --fit_range=1024,16384
       --out="$RES" --name="$3" "${@:5}")
}
peers() {  # peers DTYPE LIMIT_S: one part per length (a part's tables are written at its end)
  local dtype=() n
  (( HAS_PEER_DTYPE )) && dtype=(--dtype="$1")
  for n in ${PEER_LENGTHS//,/ }; do
    part "peers_$1_$n" "$(lim "$2")" "$PY" -m benchmarks.peers --lengths="$n" --repeats=5 \
      --memory_budget_gb=30 "${dtype[@]}" "${PEER_EXTRA[@]}" --out="$RES" \
      --name="peers_gpu_$1_$n"
  done
}

# 2. softmax_chunked in float32: dense vs the XLA flash loops vs the Pallas kernel; errors.
flash_cmd float32 xla flash_gpu_float32 "$FLASH_LENGTHS"
part flash_float32 "$(lim 80)" "${CMD[@]}"
part flash_precision "$(lim 80)" "$PY" -m benchmarks.flash_precision "${PRECISION[@]}" \
  --out="$RES" --name=flash_precision_gpu

# 3. Every mechanism against its peers, float32.
peers float32 75

# 4. The gated / delta-rule table of docs/results/gated_linear_speed.md (its targets and
#    comparisons), capped per call.
GATED=linear; COMPARE=()
for m in "${GATED_MECHANISMS[@]}"; do
  GATED+=",$m,$m@form=naive"
  COMPARE+=(--compare="$m@form=naive:$m" --compare="$m:linear")
done
part gated "$(lim 110)" "$PY" -m benchmarks.speed --targets="$GATED" --layers= \
  --lengths=$GATED_LENGTHS --modes=fwd_bwd --causal --order=length --repeats=3 \
  --time_budget_s=3 --max_time_s=1.5 --fit_range=$GATED_FIT "${COMPARE[@]}" \
  "${HEAD_FLAGS[@]}" --out="$RES" --name=gated_linear_speed_gpu

# 5. Peers in bfloat16, the flash table in bfloat16 (exact = cuDNN) and causal float32.
if (( HAS_PEER_DTYPE )); then
  peers bfloat16 75
else
  log "SKIP peers_bfloat16: benchmarks.peers has no --dtype flag"
fi
flash_cmd bfloat16 $EXACT16 flash_gpu_bfloat16 "$FLASH_LENGTHS"
part flash_bfloat16 "$(lim 50)" "${CMD[@]}"
flash_cmd float32 xla flash_gpu_float32_causal "$CAUSAL_LENGTHS" --causal
part flash_causal "$(lim 40)" "${CMD[@]}"

log "done: $(ls "$RES" | wc -l) files in $OUT/gpu_results.tgz"
tar czf "$OUT/gpu_results.tgz" -C "$RES" .
ls -l "$OUT" | tee -a "$LOG"
