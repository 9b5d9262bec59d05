#!/usr/bin/env bash
# The recall study's reports from the runs under runs/recall (a report's .json is a source
# too, so runs outlive their workdirs), then the tables of studies/recall/README.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
R=studies/recall
python -m studies.recall.report $R/recall_d.json 'runs/recall/lr1e-3_s4000/seed*' \
    'runs/recall/lr3e-3_s2000/seed*' 'runs/recall/lr1e-3_s2000/seed*' 'runs/recall/lr3e-3_s4000/seed*' \
    --out=$R --name=recall_d
python -m studies.recall.report $R/ablation.json 'runs/recall/ablate/seed*' \
    'runs/recall/ablate_lr3e-3/seed*' 'runs/recall/ablate_mamba2*/seed*' --out=$R --name=ablation
python -m studies.recall.report $R/recall_lr.json 'runs/recall/lr3e-3_s4000/seed*' \
    'runs/recall/lr1e-2_s4000/seed*' 'runs/recall/lr1e-3_s4000/seed*' --widths=64 \
    --out=$R --name=recall_lr
python -m studies.recall.report $R/recall_d.json --budget=4000,1e-3,1024 --out=$R --name=recall_grid
python -m studies.recall.report --states --out=$R --name=recall
python -m studies.recall.gradients runs/recall/lr1e-3_s4000/seed0/{softmax,linear,deltanet,gla,mamba2}-d64-l128-kv8 \
    runs/recall/lr1e-3_s4000/seed0/mamba2-d128-l128-kv8 --out=$R --name=gradients_d
python -m studies.tables --update=$R/README.md
