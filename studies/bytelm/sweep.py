"""Byte-level language modelling on real IMDB reviews: six causal mechanisms, one budget.

configs/bytelm.py for softmax, linear attention (Katharopoulos et al. 2020),
Performer (Choromanski et al. 2021), GLA (Yang et al. 2024), Mamba-2 (Dao & Gu
2024) and Gated DeltaNet (Yang, Kautz & Hatamizadeh 2025), each at width 128, 2 layers,
4 heads, MLP 512, windows of 256 bytes, batch 32, 2,000 steps (16.4 million bytes, about
half a pass over the training documents; about 30 minutes of one CPU core per model),
learning rate 2e-3. The corpus is ../shared/data/imdb_train.npz: 500 reviews held out
for validation (a seeded draw of documents), every other review trained on. The runs
are ordered seed by seed, so a cut-short sweep has one whole seed first.

Settings (key=value after ':'): seeds (default 0,1), mechanisms (default the six),
d_model, seq_len, batch_size, num_steps, validation_docs, train_docs (0: every review
not held out), data_dir (the folder holding imdb_train.npz, default ../shared/data).
The first, shorter budget of studies/bytelm/README.md is
`:d_model=64,seq_len=128,batch_size=16,num_steps=250,validation_docs=200,train_docs=2000`.

    taskset -c 1 python -m train.sweep --sweep=studies/bytelm/sweep.py \
        --root=runs/bytelm2000 run
"""

import os

from configs import common

MECHANISMS = ('softmax', 'linear', 'performer', 'gla', 'mamba2', 'gated_deltanet')
# The starts the study's runs had, before 0.2.0 changed the defaults (fla's initialisation
# for Gated DeltaNet, a convolution bias for Mamba-2): a rerun reproduces the study.
STARTS = {
  'gated_deltanet': {'attention.options.init': 'default'},
  'mamba2': {'attention.options.conv_bias': False},
}


def get_sweep(arg=None):
  args = common.parse_arg(
    arg,
    seeds=(0, 1),
    mechanisms=MECHANISMS,
    d_model=128,
    seq_len=256,
    batch_size=32,
    num_steps=2000,
    validation_docs=500,
    train_docs=0,
    data_dir='../shared/data',
  )
  common.at_least(0, seeds=args['seeds'], train_docs=args['train_docs'])
  common.at_least(
    1,
    d_model=args['d_model'],
    seq_len=args['seq_len'],
    batch_size=args['batch_size'],
    num_steps=args['num_steps'],
    validation_docs=args['validation_docs'],
  )
  corpus = os.path.join(args['data_dir'], 'imdb_train.npz')
  settings = (
    f'd_model={args["d_model"]},seq_len={args["seq_len"]},'
    f'batch_size={args["batch_size"]},num_steps={args["num_steps"]},'
    f'validation_docs={args["validation_docs"]},train_docs={args["train_docs"]},'
    f'data_dir={corpus}'
  )
  return dict(
    runs=[
      {
        'config': f'configs/bytelm.py:{m},{settings}',
        'train.seed': seed,
        'name': f'bytelm-{m}-seed{seed}',
        **STARTS.get(m, {}),
      }
      for seed in args['seeds']
      for m in args['mechanisms']
    ],
    fixed={
      'dataset.packing': False,  # one window a row, as recorded (packing is 0.3.0's default)
      'train.eval_every': args['num_steps'],
      'train.log_every': 25,
      'train.checkpoint_every': 50,
    },
  )
