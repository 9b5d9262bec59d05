"""Multi-query associative recall (MQAR; Arora et al. 2023, "Zoology") for a causal mechanism.

Each sequence opens with `num_kv_pairs` key-value pairs; every key comes back
once later (power-law gaps, `power_a`) and the model must answer with its
value. Only those positions are scored. The data is generated here
(`data/mqar.py`, Zoology's definition) and written once to
~/.cache/efficient_attn/mqar; accuracy is per query.

Zoology's code (zoology/experiments/mqar_example_configs/original_mqar_configs.py):
vocabulary 8,192, 2 layers, training (seq_len, num_kv_pairs) of (64, 4), (128, 8)
and (256, 16 to 64), 20,000 training sequences per setting (100,000 at 64
tokens), batch 256, learning rates swept over 1e-3..10^-1.5, attention with 2
heads. Their models have no MLP; here each block keeps a small one (`mlp_dim`,
twice the width by default). The defaults are the (128, 8) setting at width 64
with 2 heads, 100,000 / 1,000 / 1,000 sequences, batch 64, learning rate 3e-3 and
4,000 steps (studies/recall's budget B: softmax 99.97 +- 0.01% test accuracy over
two seeds, about 20 minutes of one CPU core). With 20,000 training sequences a
softmax model memorises them (after 2,000 steps: 43% train, 9% test accuracy);
with 100,000 it does not, and 2,000 steps leave it half-way up its jump (52%):
MQAR's curves sit on a plateau at 1/num_kv_pairs before they jump, and the jump
needs the learning rate still high.

`packing=k` (0: off) packs k sequences to a row of k * seq_len tokens, with segment
ids (`dataset.packing`, `data/packing.py`), and takes 64 / k rows a batch, so a step
sees the same 64 sequences: a model that keeps packed documents apart
(`Mechanism.segments`) learns and scores each sequence as if it were alone, and one
that leaks reads the keys of the sequences before it in the row.

The argument: the mechanism (one with a causal form), then key=value for
d_model, seq_len, num_kv_pairs, vocab_size, power_a, num_heads, depth,
mlp_dim (0: 2 x d_model), num_train, num_steps, packing:

    --config=configs/mqar.py:linear
    --config=configs/mqar.py:softmax,d_model=128,seq_len=256,num_kv_pairs=16
    --config=configs/mqar.py:gated_deltanet,packing=4

Any other file of the task in the sequence-labelling format
(`data/sequences.py`) can be evaluated with a trained run:
--mode=eval --config.dataset.source=arrays --config.dataset.data_dir=other.npz
--config.dataset.eval_split=train (a file without '{split}' is split 'train').
"""

from configs import common
from configs import presets
from data import mqar

# The argument's keys and defaults (studies/recall reads them: a run off a default is named).
DEFAULTS = dict(
  mechanism='softmax',
  d_model=64,
  seq_len=128,
  num_kv_pairs=8,
  vocab_size=8192,
  power_a=0.01,
  num_heads=2,
  depth=2,
  mlp_dim=0,
  num_train=100_000,
  num_steps=4000,
  packing=0,
)


def get_config(arg=None):
  args = common.parse_arg(arg, **DEFAULTS)
  mechanism = args['mechanism']
  common.check_causal('configs/mqar.py', mechanism)
  common.at_least(
    1,
    d_model=args['d_model'],
    num_heads=args['num_heads'],
    depth=args['depth'],
    num_train=args['num_train'],
    num_steps=args['num_steps'],
  )
  common.at_least(0, packing=args['packing'])
  mqar.check_settings(args['vocab_size'], args['seq_len'], args['num_kv_pairs'], args['power_a'])
  per_row = max(args['packing'], 1)
  config = presets.mqar(
    common.base(),
    vocab_size=args['vocab_size'],
    seq_len=args['seq_len'],
    num_kv_pairs=args['num_kv_pairs'],
    power_a=args['power_a'],
    sizes={'train': args['num_train'], 'validation': 1000, 'test': 1000},
  )
  config.model.update(
    dict(
      d_model=args['d_model'],
      depth=args['depth'],
      num_heads=args['num_heads'],
      mlp_dim=args['mlp_dim'] or 2 * args['d_model'],
    )
  )
  config.dataset.packing = args['packing'] > 0
  if config.dataset.packing:  # rows of `packing` sequences
    config.dataset.seq_len = args['seq_len']
    config.dataset.max_length = per_row * args['seq_len']
  common.set_attention(config, mechanism)
  common.fit_blocks(config, config.dataset.max_length)
  config.dataset.batch_size = max(64 // per_row, 1)
  config.dataset.eval_batch_size = max(250 // per_row, 1)
  config.optim.update(dict(learning_rate=3e-3, warmup_steps=100, weight_decay=0.1))
  config.train.update(
    dict(num_steps=args['num_steps'], log_every=100, eval_every=500, checkpoint_every=500)
  )
  return config
