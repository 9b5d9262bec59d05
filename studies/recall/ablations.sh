#!/usr/bin/env bash
# The recall study's ablations at width 64, (128, 8), two seeds: Gated DeltaNet from the
# grid's start (PyTorch's) unless init=fla, then Mamba-2; and what each Gated DeltaNet head
# keeps at initialisation. Run from anywhere; a rerun skips finished runs.
set -euo pipefail
cd "$(dirname "$0")/../.."
S=studies/recall/sweep.py
for s in 0 1; do
  for a in dt_min=1e-4,dt_max=1e-3,init=default num_heads=4,init=default init=fla; do
    python -m train.sweep --sweep=$S:seed=$s,mechanisms=gated_deltanet,$a --root=runs/recall/ablate/seed$s run
  done
  python -m train.sweep --sweep=$S:seed=$s,mechanisms=gated_deltanet,learning_rate=3e-3,init=default \
      --root=runs/recall/ablate_lr3e-3/seed$s run
  python -m train.sweep --sweep=$S:seed=$s,mechanisms=mamba2,init=fla --root=runs/recall/ablate_mamba2/seed$s run
  python -m train.sweep --sweep=$S:seed=$s,mechanisms=mamba2,learning_rate=3e-3,conv_bias=false \
      --root=runs/recall/ablate_mamba2_lr3e-3/seed$s run
done
python -m studies.recall.decay_init --out=studies/recall --name=decay_init
