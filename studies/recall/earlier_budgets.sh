#!/usr/bin/env bash
# The recall study's earlier budgets (A, B, C) and the softmax probes that chose budget D,
# each budget in its own root under runs/recall, then their reports. Run from the
# repository's root; a rerun skips finished runs and resumes a stopped one.
set -euo pipefail
cd "$(dirname "$0")/../.."
for s in 0 1; do
  # budget C at width 64, and softmax alone at width 128
  python -m train.sweep --sweep=studies/recall/sweep.py:seed=$s,learning_rate=3e-3,num_steps=2000 \
      --root=runs/recall/lr3e-3_s2000/seed$s run
  python -m train.sweep --sweep=studies/recall/sweep.py:seed=$s,widths=128,mechanisms=softmax,learning_rate=3e-3,num_steps=2000 \
      --root=runs/recall/lr3e-3_s2000/seed$s run
  # budget A (not run: GLA at width 128; seed 1 at (256, 16) beyond softmax and linear)
  python -m train.sweep --sweep=studies/recall/sweep.py:seed=$s,widths=64,128,learning_rate=1e-2,num_steps=1000 \
      --root=runs/recall/seed$s run
  python -m train.sweep --sweep=studies/recall/sweep.py:seed=$s,cells=256x16,learning_rate=1e-2,num_steps=1000 \
      --root=runs/recall/seed$s run
  # budget B (seed 1: softmax only)
  python -m train.sweep --sweep=studies/recall/sweep.py:seed=$s,vocab_size=8192,learning_rate=3e-3,num_steps=4000,mechanisms=deltanet,linear,softmax \
      --root=runs/recall/c4000/seed$s run
done
# DeltaNet without its convolution, budget A
python -m train.sweep --sweep=studies/recall/sweep.py:mechanisms=deltanet,conv_size=0,learning_rate=1e-2,num_steps=1000 \
    --root=runs/recall/ablation run
# the softmax probes, seed 0: steps, learning rate, vocabulary, width and root each
for p in 5000,1e-2,1024,64,long5000 1000,3e-3,1024,64,lr3e-3 2000,3e-3,8192,64,b2000/seed0 \
    4000,3e-3,1024,64,v1024_lr3e-3_s4000 2000,1e-3,1024,128,lr1e-3_s2000/seed0 4000,3e-3,1024,128,lr3e-3_s4000/seed0; do
  IFS=, read -r n lr v w root <<< "$p"
  python -m train.sweep --sweep=studies/recall/sweep.py:num_steps=$n,learning_rate=$lr,vocab_size=$v,widths=$w,mechanisms=softmax \
      --root=runs/recall/$root run
done
python -m studies.recall.report 'runs/recall/seed*' runs/recall/ablation --out=studies/recall --name=recall
python -m studies.recall.report 'runs/recall/seed*' 'runs/recall/c4000/seed*' 'runs/recall/b2000/seed*' \
    runs/recall/long5000 runs/recall/lr3e-3 runs/recall/v1024_lr3e-3_s4000 'runs/recall/lr3e-3_s2000/seed*' \
    --mechanisms=softmax,linear,deltanet --widths=64 --out=studies/recall --name=recall_budget
