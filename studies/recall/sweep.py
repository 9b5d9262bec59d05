"""Multi-query associative recall (MQAR; Arora et al. 2023, "Zoology"), cut to one CPU core.

configs/mqar.py (2 layers, 2 heads, MLP twice the width, learned positions,
100,000 training sequences, batch 64, AdamW with weight decay 0.1, 100 warm-up
steps and cosine decay) for each mechanism, width and cell
(seq_len x num_kv_pairs), at the study's budget: vocabulary `vocab_size`
(default 1,024; Zoology's is 8,192), peak learning rate `learning_rate`
(default 1e-3, inside Zoology's sweep of 1e-3..10^-1.5) and `num_steps` steps
(default 4,000). Accuracy is per query on the 1,000 generated test sequences.

Settings (key=value after ':'): seed (default 0; it sets `train.seed` only:
the generated data is the same for every seed), mechanisms (default softmax,
linear, mamba2, gla, deltanet, gated_deltanet), widths (default 64), cells
(default 128x8: seq_len x num_kv_pairs), vocab_size, learning_rate, num_steps,
conv_size (default -1: each mechanism's own; 0 turns the short convolution of Mamba-2,
DeltaNet and Gated DeltaNet off, and the run's name ends in '-conv0'), num_heads
(default 2, configs/mqar.py's; another count ends the run's name in '-h<count>'),
feature_map and qk_dim (linear attention's options; default: its own; Based's linear
attention is `mechanisms=linear,feature_map=taylor,qk_dim=16`, named
'...-taylor-qk16'; a mechanism without the option refuses it in one line), window
(local attention's; default: its own; named '-w<window>'), init ('fla': fla's N(0, 0.02)
for the convolution and gate projections of the gated family; named '-init<init>'),
dt_min and dt_max (Mamba-2's and Gated DeltaNet's dt range at initialisation; named
'-dtmin<value>', '-dtmax<value>'), conv_bias (true or false: the short convolution's bias,
on by default for Mamba-2 only; named '-convbias<0 or 1>' where off its default). A
mechanism may be a pattern the blocks take in turn: Based's hybrid of Taylor linear
attention and sliding-window attention is `mechanisms=linear+local,feature_map=taylor,
qk_dim=16,window=64`, named 'linear+local-...-taylor-qk16-w64' (`efficient_attn.layers.hybrid`).

    python -m train.sweep --sweep=studies/recall/sweep.py:seed=1,mechanisms=softmax,linear \
        --root=runs/recall/lr1e-3_s4000/seed1 run

The defaults are the grid's budget (D in studies/recall/README.md), at which softmax
solves (128, 8) at widths 64 and 128. Budget C, `learning_rate=3e-3,num_steps=2000`,
half the steps, solves it at width 64 only (softmax stays on the 1/num_kv_pairs
plateau at width 128). The first grid ran at budget A, `learning_rate=1e-2,
num_steps=1000`, at which softmax and linear attention stay on that plateau at both
widths; budget B is Zoology's vocabulary with a longer schedule (each budget in its
own root: a workdir's name does not say its budget):

    python -m train.sweep --sweep=studies/recall/sweep.py:learning_rate=3e-3,num_steps=2000 \
        --root=runs/recall/lr3e-3_s2000/seed0 run
    python -m train.sweep --sweep=studies/recall/sweep.py:learning_rate=1e-2,num_steps=1000 \
        --root=runs/recall/seed0 run
    python -m train.sweep --sweep=studies/recall/sweep.py:vocab_size=8192,num_steps=4000 \
        --root=runs/recall/c4000/seed0 run

Workdirs are named `<mechanism>-d<width>-l<seq_len>-kv<pairs>`, so a run's
name says its cell; the seed is the root folder's.
"""

from configs import common
from configs import mqar
from efficient_attn.layers import hybrid


def parse_cell(cell: str):
  """'128x8' -> (128, 8); a one-line ValueError for anything else."""
  length, sep, pairs = cell.partition('x')
  if not (sep and length.isdigit() and pairs.isdigit()):
    raise ValueError(
      f'recall sweep: cell {cell!r} is not valid; write seq_len x '
      f'num_kv_pairs, e.g. 128x8 or 256x16'
    )
  return int(length), int(pairs)


# The sweep's settings and their defaults (the grid's budget, D); the report's plan reads them.
DEFAULTS = dict(
  seed=0,
  mechanisms=('softmax', 'linear', 'mamba2', 'gla', 'deltanet', 'gated_deltanet'),
  widths=(64,),
  cells=('128x8',),
  vocab_size=1024,
  learning_rate=1e-3,
  num_steps=4000,
  conv_size=-1,
  num_heads=mqar.DEFAULTS['num_heads'],
  feature_map='',
  qk_dim=0,
  window=0,
  init='',
  dt_min=0.0,
  dt_max=0.0,
  conv_bias='',
)

# The mechanism options a sweep setting may set (unset: '' or 0), and how a run's name says
# one set off its mechanism's default.
OPTION_NAMES = (
  ('feature_map', '-{}'),
  ('qk_dim', '-qk{}'),
  ('window', '-w{}'),
  ('init', '-init{}'),
  ('dt_min', '-dtmin{:g}'),
  ('dt_max', '-dtmax{:g}'),
  ('conv_bias', '-convbias{:d}'),
)


def own_options(mechanism: str, options):
  """The `options` that name a run: those off the mechanism's defaults, or not its options
  (the config refuses those in one line), so a run named alike is the same model."""
  if hybrid.unregistered(mechanism):
    return dict(options)  # the config names the unknown mechanism
  return hybrid.off_defaults(mechanism, options)  # a pattern 'a+b': by its mechanisms' options


def get_sweep(arg=None):
  args = common.parse_arg(arg, **DEFAULTS)
  common.at_least(0, seed=args['seed'])
  common.at_least(1, widths=args['widths'], num_steps=args['num_steps'])
  if not args['learning_rate'] > 0:
    raise ValueError(
      f'recall sweep: learning_rate={args["learning_rate"]} is not valid; it must be > 0'
    )
  conv = args['conv_size']
  common.at_least(-1, conv_size=conv)
  heads = args['num_heads']  # the config checks it against each width
  own_heads = heads != mqar.DEFAULTS['num_heads']
  common.at_least(
    0, qk_dim=args['qk_dim'], window=args['window'], dt_min=args['dt_min'], dt_max=args['dt_max']
  )
  bias = args['conv_bias']
  if bias not in ('', 'true', 'false'):
    raise ValueError(
      f"recall sweep: conv_bias={bias!r} is not valid; valid: true, false, or "
      f"unset (each mechanism's own)"
    )
  options = {k: args[k] for k, _ in OPTION_NAMES if k != 'conv_bias' and args[k]}  # set
  if bias:
    options['conv_bias'] = bias == 'true'
  runs = []
  for cell in args['cells']:
    length, pairs = parse_cell(cell)
    for width in args['widths']:
      for m in args['mechanisms']:
        named = own_options(m, options)
        runs.append(
          {
            'name': (
              f'{m}-d{width}-l{length}-kv{pairs}'
              + (f'-conv{conv}' if conv >= 0 else '')
              + (f'-h{heads}' if own_heads else '')
              + ''.join(form.format(named[k]) for k, form in OPTION_NAMES if k in named)
            ),
            'config': (
              f'configs/mqar.py:{m},d_model={width},seq_len={length},'
              f'num_kv_pairs={pairs},vocab_size={args["vocab_size"]},'
              f'num_steps={args["num_steps"]}' + (f',num_heads={heads}' if own_heads else '')
            ),
          }
        )
  fixed = {
    'train.seed': args['seed'],
    'optim.learning_rate': args['learning_rate'],
    'train.log_every': 50,
    'train.eval_every': 500,
    'train.checkpoint_every': 250,
  }
  if conv >= 0:
    fixed['attention.options.conv_size'] = conv
  fixed.update({f'attention.options.{k}': v for k, v in options.items()})
  return dict(runs=runs, fixed=fixed)
