r"""Real tokens per second of a training step: rows padded one document each, against packed.

    python -m benchmarks.packing --out=docs/results
    python -m benchmarks.packing --cases=softmax,gated_deltanet:implementation=pallas

The documents are the byte LM's (`configs/bytelm.py`, by default Python's reference
documentation), cut into windows of at most `--seq_len` bytes as the byte LM cuts them
(`data/text_bytes.pieces`), so the lengths are that corpus's own. **Padded**: each window
is a row of its own, padded to `--seq_len`. **Packed**: the windows are packed several to
a row (`data/packing.py`, best-fit decreasing) and the model gets their segment ids. Each
case times one training step of the causal byte LM (the gradient of the cross-entropy on
the real bytes, jit-compiled; compilation excluded) on `--batch` rows of each kind, drawn
from the rows of each layout with one seed; real tokens per second is the real bytes of
those rows over the step's median time.

A last column is the cost of segments where packing gains nothing: the step on full rows
(one whole window each) with segment ids of one document, against the same rows without.
The issue's goals (68): packed at least 1.5x padded wherever padding wastes 40% or more,
and segments on full rows under 5%.

A case is a mechanism or a hybrid pattern ('gated_deltanet+softmax') and options after
colons ('gated_deltanet:implementation=pallas'). A mechanism that does not keep packed
documents apart (its declaration's `segments`) is timed padded, and its packed cells say
that the model refused the segment ids, with the model's one-line reason in the JSON.

Writes <out>/<name>.json and <out>/<name>.md (the table, with this command).
"""

from typing import Any, Dict, Optional, Sequence

from absl import flags
import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks import common
from benchmarks import machine
from benchmarks import output
from benchmarks import timing
import data
from efficient_attn.models import CausalTransformer
from efficient_attn.models import TransformerConfig

CASES = (
  'softmax,softmax_chunked,gated_deltanet:implementation=xla,'
  'gated_deltanet:implementation=pallas,gated_deltanet+softmax'
)


def define_flags(fv: flags.FlagValues) -> None:
  common.define_output_flags(fv, out='benchmark_results/packing', name='packing')
  flags.DEFINE_string('cases', CASES, 'comma list of mechanism[:option=value...]', flag_values=fv)
  flags.DEFINE_string('corpus', data.BUILTIN_CORPUS, 'the byte LM corpus', flag_values=fv)
  flags.DEFINE_integer('seq_len', 256, 'row length (bytes)', flag_values=fv)
  flags.DEFINE_integer('batch', 16, 'rows a step', flag_values=fv)
  flags.DEFINE_integer('d_model', 128, 'model width', flag_values=fv)
  flags.DEFINE_integer('depth', 2, 'layers', flag_values=fv)
  flags.DEFINE_integer('num_heads', 4, 'heads', flag_values=fv)
  flags.DEFINE_integer('repeats', 10, 'timed steps (median)', flag_values=fv)
  flags.DEFINE_float('budget_s', 30.0, 'time budget per measurement', flag_values=fv)
  flags.DEFINE_integer('seed', 0, 'which rows are timed', flag_values=fv)


def parse_case(case: str):
  """'gated_deltanet:implementation=pallas' -> ('gated_deltanet', {'implementation':
  'pallas'}); ValueError on an option without '='."""
  pattern, *items = case.split(':')
  options = {}
  for item in items:
    key, eq, value = item.partition('=')
    if not eq or not key:
      raise ValueError(f'--cases: {case!r}: option {item!r} is not key=value')
    options[key] = common.parse_value(value)
  return pattern, options


def layouts(docs: Sequence[bytes], seq_len: int) -> Dict[str, Dict[str, np.ndarray]]:
  """{'padded', 'packed', 'full'}: (inputs, labels, segment_ids) `[rows, seq_len]` of the
  windows of `docs`; 'full' is the windows that fill a row (segment ids all 1)."""
  inputs, labels = data.byte_windows(docs, seq_len)
  ids = (labels >= 0).astype(np.int32)  # one document a row, then padding
  packed = data.packed_windows(docs, seq_len)
  whole = ids.all(1)
  if not whole.any():
    raise ValueError(f'no window of the corpus fills a row of seq_len={seq_len}; lower it')
  return {
    'padded': dict(inputs=inputs, labels=labels, segment_ids=ids),
    'packed': dict(zip(('inputs', 'labels', 'segment_ids'), packed)),
    'full': dict(inputs=inputs[whole], labels=labels[whole], segment_ids=ids[whole]),
  }


def draw(rows: Dict[str, np.ndarray], batch: int, seed: int) -> Dict[str, jnp.ndarray]:
  """`batch` rows of a layout, drawn with `seed` (repeated when it has fewer)."""
  n = len(rows['inputs'])
  pick = np.random.default_rng(seed).choice(n, batch, replace=n < batch)
  return {k: jnp.asarray(v[pick], jnp.int32) for k, v in rows.items()}


def make_step(model):
  """The jit-compiled gradient of the mean cross-entropy on the real tokens:
  `step(params, inputs, labels, segment_ids or None)`."""

  def loss(params, inputs, labels, segment_ids):
    extra = {} if segment_ids is None else {'segment_ids': segment_ids}
    logits = model.apply({'params': params}, inputs, **extra)
    weight = (labels >= 0).astype(jnp.float32)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.maximum(labels, 0))
    return (ce * weight).sum() / jnp.maximum(weight.sum(), 1.0)

  return jax.jit(jax.grad(loss))


def measure(step, params, rows, *, segments: bool, args) -> Dict[str, Any]:
  """The step's time on `rows` and its real tokens per second; with `segments`, the model
  gets the rows' segment ids ('refused' holds its one-line ValueError if it refuses)."""
  ids = rows['segment_ids'] if segments else None
  call = (params, rows['inputs'], rows['labels'], ids)
  try:
    timed = timing.time_compiled(step, call, repeats=args.repeats, budget_s=args.budget_s)
  except ValueError as e:
    return {'refused': str(e).splitlines()[0]}
  real = int((rows['labels'] >= 0).sum())
  return dict(timed, real_tokens=real, tokens_per_s=real / timed['time_s'])


def run(args, command: str) -> Dict[str, Any]:
  """The measurements of every case (`command`: the command line, for the table)."""
  with common.flag_errors():
    cases = [(case, *parse_case(case)) for case in common.csv_list(args.cases)]
    docs = data.read_corpus(args.corpus)
    rows = layouts(docs, args.seq_len)
  lengths = (rows['padded']['labels'] >= 0).sum(1)
  result: Dict[str, Any] = dict(
    config=args.flag_values_dict(),
    device=machine.device_info(),
    command=command,
    windows=int(len(lengths)),
    padding_waste=1.0 - float(lengths.mean()) / args.seq_len,
    packed_rows=int(len(rows['packed']['inputs'])),
    packed_waste=1.0 - data.packed_fill(rows['packed']['segment_ids']),
    cases={},
  )
  batches = {name: draw(r, args.batch, args.seed) for name, r in rows.items()}
  for case, pattern, options in cases:
    config = TransformerConfig(
      max_length=args.seq_len,
      d_model=args.d_model,
      depth=args.depth,
      num_heads=args.num_heads,
      mlp_dim=4 * args.d_model,
      mechanism=pattern,
      options=options or None,
    )
    model = CausalTransformer(config, vocab_size=256)
    params = jax.jit(model.init)(jax.random.key(0), batches['padded']['inputs'][:1])['params']
    step = make_step(model)
    if not args.quiet:
      common.emit(f'{case}: timing')
    result['cases'][case] = dict(
      padded=measure(step, params, batches['padded'], segments=False, args=args),
      packed=measure(step, params, batches['packed'], segments=True, args=args),
      full=measure(step, params, batches['full'], segments=False, args=args),
      full_segments=measure(step, params, batches['full'], segments=True, args=args),
    )
  return result


def markdown(result: Dict[str, Any]) -> str:
  c = result['config']
  notes = [
    f"corpus {c['corpus']}: {result['windows']} windows of at most {c['seq_len']} bytes; "
    f"padded one a row, {100 * result['padding_waste']:.0f}% of the tokens are padding; "
    f"packed into {result['packed_rows']} rows, {100 * result['packed_waste']:.1f}%",
    f"a training step (gradient of the byte LM's loss) on {c['batch']} rows; model "
    f"d_model={c['d_model']}, depth={c['depth']}, heads={c['num_heads']}; median of up to "
    f"{c['repeats']} steps, compilation excluded",
    'segments on full rows: the step on rows that are one whole window each, with segment '
    'ids against without (the goal: under 5%)',
    f"command: `{result['command']}`",
  ]
  refused = 'refused (no segments)'
  headers = ['case', 'padded tok/s', 'packed tok/s', 'packed / padded', 'segments on full rows']
  table_rows = []
  for case, m in result['cases'].items():
    padded, packed = m['padded'], m['packed']
    full, with_ids = m['full'], m['full_segments']
    speedup = cost = refused
    if 'refused' not in packed:
      speedup = f"{packed['tokens_per_s'] / padded['tokens_per_s']:.2f}x"
    if 'refused' not in with_ids:
      cost = f"{100 * (with_ids['time_s'] / full['time_s'] - 1):+.1f}%"
    table_rows.append(
      [
        case,
        output.fmt_count(padded.get('tokens_per_s')),
        output.fmt_count(packed.get('tokens_per_s')) or refused,
        speedup,
        cost,
      ]
    )
  text = output.header(
    'Packed against padded rows: real tokens per second',
    machine.describe_device(result['device']),
    notes,
  )
  return text + '\n' + output.table(headers, table_rows) + '\n'


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  args = common.parse_flags(define_flags, argv, __doc__)
  result = run(args, output.command('benchmarks.packing', argv))
  output.finish(args.out, args.name, result, markdown(result), quiet=args.quiet)
  return result


if __name__ == '__main__':
  main()
