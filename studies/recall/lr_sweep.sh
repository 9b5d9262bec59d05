#!/usr/bin/env bash
# The recall study's learning-rate sweep (Zoology's protocol) at width 64, (128, 8), 4,000
# steps: seed 0 at peak rates 3e-3 and 1e-2 (1e-3 is the grid's), Mamba-2 at 1e-3 with its
# convolution bias (the grid ran it without), then a second seed at each mechanism's best
# rate where the grid has none (its 1e-3 runs have two seeds, but not Mamba-2's with the
# bias). Run from anywhere; a rerun skips finished runs and resumes a stopped one.
set -euo pipefail
cd "$(dirname "$0")/../.."
M=softmax,linear,mamba2,gla,deltanet,gated_deltanet
for lr in 3e-3 1e-2; do
  python -m train.sweep --sweep=studies/recall/sweep.py:seed=0,learning_rate=$lr,mechanisms=$M \
      --root=runs/recall/lr${lr}_s4000/seed0 run
done
python -m train.sweep --sweep=studies/recall/sweep.py:seed=0,mechanisms=mamba2,conv_bias=true \
    --root=runs/recall/lr1e-3_s4000/seed0 run
python -m train.sweep --sweep=studies/recall/sweep.py:seed=1,learning_rate=3e-3,mechanisms=softmax,gated_deltanet \
    --root=runs/recall/lr3e-3_s4000/seed1 run
python -m train.sweep --sweep=studies/recall/sweep.py:seed=1,learning_rate=1e-2,mechanisms=linear \
    --root=runs/recall/lr1e-2_s4000/seed1 run
python -m train.sweep --sweep=studies/recall/sweep.py:seed=1,mechanisms=mamba2,conv_bias=true \
    --root=runs/recall/lr1e-3_s4000/seed1 run
