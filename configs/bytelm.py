"""Byte-level language modelling on real text, for a causal mechanism (bits per byte).

A causal model over bytes (256 symbols, `data/text_bytes.py`): documents of a
corpus, an `.npz` (`text_utf8` uint8 concatenated, `offsets` [n + 1], as
../shared/data/imdb_train.npz) or a folder of `.txt` files, cut into windows
of `seq_len` bytes, every byte predicted from the ones before it in its
window. `validation_docs` documents (a seeded draw) are held out and never
trained on; the windows are written once to ~/.cache/efficient_attn/text_bytes.
Metrics: 'bits_per_byte' (and 'loss' in nats, 'accuracy' of the next byte) on
the held-out documents. After training (and in --mode=eval) the run continues
held-out prompts into samples.txt / samples.json (the `sample` group).

The argument: the mechanism (one with a causal form), then key=value for
d_model, seq_len, depth, num_heads, mlp_dim (0: 4 x d_model), data_dir (the
corpus: an .npz or a folder of .txt files; the default is this project's IMDB
copy beside the checkout, so a fresh clone names its own), validation_docs,
train_docs (0: every document not held out), batch_size, num_steps,
learning_rate:

    --config=configs/bytelm.py:gla,data_dir=my_texts/
    --config=configs/bytelm.py:softmax,d_model=128,seq_len=256,data_dir=my_texts/
"""
from configs import common


def get_config(arg=None):
  args = common.parse_arg(arg, mechanism='softmax', d_model=128, seq_len=256, depth=2,
                          num_heads=4, mlp_dim=0, data_dir='../shared/data/imdb_train.npz',
                          validation_docs=500, train_docs=0, batch_size=32, num_steps=2000,
                          learning_rate=2e-3)
  mechanism = args['mechanism']
  common.check_causal('configs/bytelm.py', mechanism)
  common.at_least(1, d_model=args['d_model'], seq_len=args['seq_len'], depth=args['depth'],
                  num_heads=args['num_heads'], validation_docs=args['validation_docs'],
                  batch_size=args['batch_size'], num_steps=args['num_steps'])
  common.at_least(0, train_docs=args['train_docs'], mlp_dim=args['mlp_dim'])
  if not args['data_dir']:
    raise ValueError("configs/bytelm.py: data_dir='' is not valid; it must be the corpus, an "
                     ".npz (text_utf8, offsets) or a folder of .txt files")
  config = common.text_bytes(common.base(), corpus=args['data_dir'], seq_len=args['seq_len'],
                             validation_docs=args['validation_docs'],
                             train_docs=args['train_docs'])
  config.model.update(dict(d_model=args['d_model'], depth=args['depth'],
                           num_heads=args['num_heads'],
                           mlp_dim=args['mlp_dim'] or 4 * args['d_model']))
  common.set_attention(config, mechanism)
  common.fit_blocks(config, args['seq_len'])
  prompt = min(64, args['seq_len'] // 4)  # the held-out continuations fit the context
  config.sample.update(dict(prompt_bytes=max(prompt, 1), new_bytes=min(
      128, args['seq_len'] - prompt), num_samples=2 if args['seq_len'] >= 2 else 0))
  config.dataset.batch_size = args['batch_size']
  config.dataset.eval_batch_size = 128
  config.optim.update(dict(learning_rate=args['learning_rate'], warmup_steps=100,
                           weight_decay=0.1))
  config.train.update(dict(num_steps=args['num_steps'], log_every=50, eval_every=500,
                           checkpoint_every=250))
  return config
