r"""Every mechanism against its published peer, timed alternately in one process.

    python -m benchmarks.peers --out=docs/results --name=peers

For each pair (library mechanism, peer from `benchmarks.peer_algorithms`) and
each length: both are compiled (forward + backward: the gradient of sum(output)
w.r.t. q, k, v and any parameters), warmed up, then called alternately, and the
ratio of median times library / peer is reported (below 1: the library is
faster). Pairs run one after another, so both sides of a pair follow the same
neighbour (a call right after a much larger program pays page faults). The
peers get the library's settings: the same number of random features (FAVOR+),
landmarks (Nystromformer) and projected length (Linformer). A point whose
compiled program needs more memory than --memory_budget_gb (XLA's analysis) is
skipped, with the reason. Writes <out>/<name>.json, .md and _ratio.png.

Two kinds of peer, named in the table's "peer code" column:

  published  the peer's own code, run unchanged (`benchmarks.published`):
             `flax_softmax` is `flax.linen.dot_product_attention`; `favor_published`
             and `favor_causal_published` are google-research's
             `performer/fast_attention/jax/fast_attention.py` (its file, checked by
             sha256; a pair whose file is absent is skipped, saying where to put it).
  recipe     our copy of a published algorithm in `benchmarks.peer_algorithms`,
             kept where no runnable original exists (LRA's modules use the removed
             `flax.nn`) and beside the published FAVOR+ as the recipe it follows.

Flags (stable; the GPU script calls them):
  --lengths=1024,4096,8192  --pairs=<mechanism or peer names>  --dtype=float32|bfloat16
  --batch=1 --heads=8 --head_dim=64 --features=256 --landmarks=64 --k_proj=64
  --repeats=5 --memory_budget_gb=<GiB> --out=<folder> --name=<stem> --quiet

--dtype casts q, k, v (and so every side's compute) to float32 or bfloat16; each
side then runs in its own precision policy (the library's kernel mechanisms
accumulate in float32; the published FAVOR+ promotes to float32 itself).
Runs without ml_collections, clu or tensorflow.
"""

import statistics
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

import jax
import jax.numpy as jnp

from benchmarks import attention_bench
from benchmarks import common
from benchmarks import machine
from benchmarks import output
from benchmarks import peer_algorithms as peers
from benchmarks import published
from benchmarks import timing
from benchmarks import xla_stats
from efficient_attn.ops import feature_maps

# (library mechanism, causal, peer name)
PAIRS = (
  ('softmax', False, 'exact'),
  ('softmax', False, 'flax_softmax'),
  ('softmax', True, 'exact'),
  ('softmax', True, 'flax_softmax'),
  ('softmax_chunked', False, 'exact'),
  ('softmax_chunked', False, 'flax_softmax'),
  ('softmax_chunked', True, 'exact'),
  ('softmax_chunked', True, 'flax_softmax'),
  ('linear', False, 'linear'),
  ('linear', True, 'linear_causal'),
  ('performer', False, 'favor_published'),
  ('performer', False, 'favor'),
  ('performer', True, 'favor_causal_published'),
  ('performer', True, 'favor_causal'),
  ('linformer', False, 'linformer'),
  ('nystrom', False, 'nystromformer'),
)
# Peers whose own published code runs (the others are recipes in peer_algorithms).
PUBLISHED = {
  'flax_softmax': '`flax.linen.dot_product_attention`',
  'favor_published': "google-research's `fast_attention.py`",
  'favor_causal_published': "google-research's `fast_attention.py`, unidirectional",
}
DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}


def define_flags(fv):
  from absl import flags  # pylint: disable=g-import-not-at-top

  flags.DEFINE_list('lengths', ['1024', '4096', '8192'], 'sequence lengths', flag_values=fv)
  flags.DEFINE_list(
    'pairs',
    [],
    "only these pairs, e.g. 'performer,linear_causal' (a "
    "mechanism name, or a peer name); default all",
    flag_values=fv,
  )
  flags.DEFINE_integer('batch', 1, 'batch size', flag_values=fv)
  flags.DEFINE_integer('heads', 8, 'heads', flag_values=fv)
  flags.DEFINE_integer('head_dim', 64, 'dimension per head', flag_values=fv)
  flags.DEFINE_integer('features', 256, 'random features (performer and FAVOR+)', flag_values=fv)
  flags.DEFINE_integer('landmarks', 64, 'landmarks (nystrom and Nystromformer)', flag_values=fv)
  flags.DEFINE_integer('k_proj', 64, 'projected length (linformer)', flag_values=fv)
  flags.DEFINE_enum('dtype', 'float32', list(DTYPES), 'q, k, v dtype', flag_values=fv)
  flags.DEFINE_integer(
    'repeats', 5, 'timed calls of each side (alternating)', lower_bound=1, flag_values=fv
  )
  flags.DEFINE_float(
    'memory_budget_gb',
    None,
    "per program, by XLA's memory analysis (default 60% of RAM)",
    flag_values=fv,
  )
  common.define_output_flags(fv, out='benchmark_results', name='peers')


def _options(fv) -> Dict[str, Dict[str, Any]]:
  return {
    'performer': {'num_features': fv.features},
    'nystrom': {'num_landmarks': fv.landmarks},
    'linformer': {'k_proj': fv.k_proj},
  }


def peer_fn(name: str, n: int, causal: bool, fv):
  """(params, f(params, q, k, v)): the peer and its own random draws (a dict, maybe empty)."""
  key = jax.random.PRNGKey(1)
  if name in ('favor_published', 'favor_causal_published'):
    fn = published.favor(fv.head_dim, fv.features, causal=name == 'favor_causal_published')
    return {}, lambda p, q, k, v: fn(q, k, v)
  if name == 'flax_softmax':
    fn = published.flax_softmax(causal)
    return {}, lambda p, q, k, v: fn(q, k, v)
  if name in ('favor', 'favor_causal'):
    proj = feature_maps.gaussian_projection(key, fv.features, fv.head_dim, orthogonal=True)
    fn = peers.favor if name == 'favor' else peers.favor_causal
    return {}, lambda p, q, k, v: fn(q, k, v, proj)
  if name == 'linformer':
    e, f = (jax.random.normal(key, (2, n, fv.k_proj)) / fv.k_proj**0.5).astype(DTYPES[fv.dtype])
    return {'e': e, 'f': f}, lambda p, q, k, v: peers.linformer(q, k, v, p['e'], p['f'])
  if name == 'nystromformer':
    return {}, lambda p, q, k, v: peers.nystromformer(q, k, v, fv.landmarks)
  if name == 'exact':
    return {}, lambda p, q, k, v: peers.exact(q, k, v, causal)
  return {}, lambda p, q, k, v: getattr(peers, name)(q, k, v)


def _compile(fn, args, budget: float):
  """(compiled, None) or (None, reason) when XLA says the program needs more than `budget`."""
  compiled = jax.jit(fn).lower(*args).compile()
  mem = (xla_stats.memory(compiled) or {}).get('total')
  if mem is not None and mem > budget:
    return None, f'needs {output.fmt_bytes(mem)} > budget {output.fmt_bytes(budget)}'
  return compiled, None


def measure_length(n: int, pairs: Sequence[tuple], fv, budget: float) -> List[Dict[str, Any]]:
  """Times every pair at length n, its two sides alternating. One record per pair."""
  q, k, v = attention_bench.random_qkv(0, fv.batch, n, fv.heads, fv.head_dim, DTYPES[fv.dtype])
  options = _options(fv)
  sides, rows = {}, []
  for mechanism, causal, peer in pairs:
    row = dict(
      mechanism=mechanism,
      causal=causal,
      peer=peer,
      length=n,
      peer_kind='published' if peer in PUBLISHED else 'recipe',
    )
    bench = attention_bench.mechanism_bench(
      mechanism, q, k, v, options=options.get(mechanism), causal=causal
    )
    ours_fn, ours_args = bench.forward_backward()
    ours, reason = _compile(ours_fn, ours_args, budget)
    try:
      params, fn = peer_fn(peer, n, causal, fv)
    except (FileNotFoundError, ValueError) as e:  # the published file absent or altered
      theirs, peer_reason = None, str(e)
    else:
      grad = jax.grad(
        lambda p, q, k, v: jnp.sum(fn(p, q, k, v).astype(jnp.float32)), argnums=(0, 1, 2, 3)
      )
      theirs, peer_reason = _compile(grad, (params, q, k, v), budget)
    row['skipped'] = reason and f'library: {reason}' or peer_reason and f'peer: {peer_reason}'
    if not row['skipped']:
      sides[len(rows)] = ((ours, ours_args), (theirs, (params, q, k, v)))
    rows.append(row)
  times = {(i, s): [] for i in sides for s in (0, 1)}
  for i, pair in sides.items():  # pair by pair, its two sides alternating
    for compiled, args in pair:  # warm-up
      timing.block(compiled(*args))
    for _ in range(fv.repeats):
      for s, (compiled, args) in enumerate(pair):
        start = time.perf_counter()
        timing.block(compiled(*args))
        times[(i, s)].append(time.perf_counter() - start)
  for i, row in enumerate(rows):
    if i in sides:
      row.update(
        library_s=statistics.median(times[(i, 0)]),
        peer_s=statistics.median(times[(i, 1)]),
        library_times_s=times[(i, 0)],
        peer_times_s=times[(i, 1)],
      )
      row['ratio'] = row['library_s'] / row['peer_s']
  return rows


def _label(row) -> str:
  return f"{row['mechanism']}{' causal' if row['causal'] else ''} vs {row['peer']}"


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  fv = common.parse_flags(define_flags, argv, __doc__)
  lengths = [int(x) for x in fv.lengths]
  pairs = [p for p in PAIRS if not fv.pairs or p[0] in fv.pairs or p[2] in fv.pairs]
  if not pairs:
    raise SystemExit(
      f'Error: --pairs={",".join(fv.pairs)} matches none of '
      f'{sorted({p[0] for p in PAIRS} | {p[2] for p in PAIRS})}'
    )
  total = machine.total_memory_bytes() or 16 * 2**30
  budget = fv.memory_budget_gb * 2**30 if fv.memory_budget_gb else 0.6 * total
  rows = []
  for n in lengths:
    start = time.perf_counter()
    rows += measure_length(n, pairs, fv, budget)
    if not fv.quiet:
      print(f'length {n}: {time.perf_counter() - start:.0f} s', flush=True)
  info = machine.device_info()
  labels = list(dict.fromkeys(_label(r) for r in rows))
  by = {(_label(r), r['length']): r for r in rows}

  def cell(label, n):
    r = by[(label, n)]
    if r['skipped']:
      return 'skipped'
    return f"{r['ratio']:.2f}x ({output.fmt_time(r['library_s'])} / {output.fmt_time(r['peer_s'])})"

  def kind(label):
    peer = next(r['peer'] for r in rows if _label(r) == label)
    return f'published: {PUBLISHED[peer]}' if peer in PUBLISHED else 'recipe: `peer_algorithms`'

  table = output.table(
    ['library vs peer', 'peer code'] + [f'n={n}' for n in lengths],
    [[lab, kind(lab)] + [cell(lab, n) for n in lengths] for lab in labels],
  )
  notes = [
    f'forward + backward, batch {fv.batch}, {fv.heads} heads, head_dim {fv.head_dim}, '
    f'{fv.dtype}; performer and FAVOR+ {fv.features} features, nystrom and Nystromformer '
    f'{fv.landmarks} landmarks, linformer k = {fv.k_proj}.',
    f'cell: library time / peer time (below 1: the library is faster), medians of '
    f'{fv.repeats} alternating calls each after one warm-up, pair by pair.',
    'peer code: "published" runs the peer\'s own code unchanged (`benchmarks/published`; '
    "google-research's FAVOR+ with redraw_features=False, its own projection of the "
    'same size); "recipe" is our copy of the algorithm in '
    '`benchmarks/peer_algorithms.py` (exact = `jax.nn.dot_product_attention`, XLA).',
    'command: python -m benchmarks.peers ' + ' '.join(sys.argv[1:] if argv is None else argv),
  ]
  skipped = [f"- {_label(r)}, n={r['length']}: {r['skipped']}" for r in rows if r['skipped']]
  markdown = '\n'.join(
    [
      output.header('The library against its peers', machine.describe_device(info), notes),
      table,
      '',
    ]
    + (['Skipped:', ''] + skipped + [''] if skipped else [])
  )
  series = {lab: (lengths, [by[(lab, n)].get('ratio') for n in lengths]) for lab in labels}
  output.line_plot(
    f'{fv.out}/{fv.name}_ratio.png',
    [('library time / peer time', series)],
    xlabel='sequence length',
    ylabel='ratio',
    hlines=[(1.0, 'parity')],
  )
  data = dict(device=info, flags={f: fv[f].value for f in fv}, rows=rows)
  output.finish(fv.out, fv.name, data, markdown, quiet=fv.quiet)
  return data


if __name__ == '__main__':
  main()
