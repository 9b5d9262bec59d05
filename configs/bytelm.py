"""Byte-level language modelling on real text, for a causal mechanism (bits per byte).

A causal model over bytes (256 symbols, `data/text_bytes.py`): documents of a
corpus cut into windows of `seq_len` bytes, every byte predicted from the ones
before it in its window. The corpus (`config.dataset.corpus`) is any text
file (its paragraphs are the documents), a folder (every text file in it, in
sorted order, one document each), an `.npz` of documents (`text_utf8`,
`offsets`) or, by default, 'builtin:python_docs': Python's own reference
documentation as the running Python ships it (pydoc_data, PSF licence), so
`python main.py --config=configs/bytelm.py` runs from a fresh clone with no
download. `validation_docs` documents (a seeded draw) are held out and never
trained on; the windows are written once to `data.cache_folder.cache_dir('text_bytes')`
(~/.cache/efficient_attn/text_bytes; $EFFICIENT_ATTN_CACHE or $XDG_CACHE_HOME
move it). The corpus's sha256 is stored with the run (`dataset.corpus_sha256`
in config.json): a resume on edited text is refused. Metrics: 'bits_per_byte'
(and 'loss' in nats, 'accuracy' of the next byte) on the held-out documents.
After training (and in --mode=eval) the run continues held-out prompts into
samples.txt / samples.json (the `sample` group), with `efficient_attn.models.generate`.

Packed by default (`dataset.packing`, `data/packing.py`): the windows of `seq_len`
bytes are packed several to a row, with segment ids, so a batch holds about twice the
real bytes of one window a row (the default corpus's paragraphs leave 48% of 256-byte
windows as padding); every byte is still scored once, in the context of its own window.
The mechanism must keep packed documents apart (`Mechanism.segments`); one that cannot
is refused in one line, and `packing=0` trains one window a row instead. The packing is
part of the run (config.json): a resume with the other packing is refused.

The argument: the mechanism (one with a causal form), then key=value for
d_model, seq_len, depth, num_heads, mlp_dim (0: 4 x d_model), data_dir (the
corpus, the same as --config.dataset.corpus), validation_docs, train_docs (0:
every document not held out), batch_size, num_steps, learning_rate, packing (1):

    --config=configs/bytelm.py:gla --config.dataset.corpus=my_texts/
    --config=configs/bytelm.py:softmax,d_model=128,seq_len=256,data_dir=novel.txt
    --config=configs/bytelm.py:reformer,packing=0
"""

from configs import common
from configs import presets
from data import text_bytes


def get_config(arg=None):
  args = common.parse_arg(
    arg,
    mechanism='softmax',
    d_model=128,
    seq_len=256,
    depth=2,
    num_heads=4,
    mlp_dim=0,
    data_dir=text_bytes.BUILTIN,
    validation_docs=500,
    train_docs=0,
    batch_size=32,
    num_steps=2000,
    learning_rate=2e-3,
    packing=True,
  )
  mechanism = args['mechanism']
  common.check_causal('configs/bytelm.py', mechanism)
  common.at_least(
    1,
    d_model=args['d_model'],
    seq_len=args['seq_len'],
    depth=args['depth'],
    num_heads=args['num_heads'],
    validation_docs=args['validation_docs'],
    batch_size=args['batch_size'],
    num_steps=args['num_steps'],
  )
  common.at_least(0, train_docs=args['train_docs'], mlp_dim=args['mlp_dim'])
  if not args['data_dir']:
    raise ValueError(
      f"configs/bytelm.py: data_dir='' is not valid; it must be the corpus: a "
      f"text file, a folder of text files, an .npz (text_utf8, offsets) or "
      f"{text_bytes.BUILTIN!r}"
    )
  config = presets.text_bytes(
    common.base(),
    corpus=args['data_dir'],
    seq_len=args['seq_len'],
    validation_docs=args['validation_docs'],
    train_docs=args['train_docs'],
  )
  config.model.update(
    dict(
      d_model=args['d_model'],
      depth=args['depth'],
      num_heads=args['num_heads'],
      mlp_dim=args['mlp_dim'] or 4 * args['d_model'],
    )
  )
  common.set_attention(config, mechanism)
  common.fit_blocks(config, args['seq_len'])
  prompt = min(64, args['seq_len'] // 4)  # the held-out continuations fit the context
  config.sample.update(
    dict(
      prompt_bytes=max(prompt, 1),
      new_bytes=min(128, args['seq_len'] - prompt),
      num_samples=2 if args['seq_len'] >= 2 else 0,
    )
  )
  config.dataset.packing = args['packing']
  config.dataset.batch_size = args['batch_size']
  config.dataset.eval_batch_size = 128
  config.optim.update(dict(learning_rate=args['learning_rate'], warmup_steps=100, weight_decay=0.1))
  config.train.update(
    dict(num_steps=args['num_steps'], log_every=50, eval_every=500, checkpoint_every=250)
  )
  return config
