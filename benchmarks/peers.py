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
"""
import statistics
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

import jax
import jax.numpy as jnp

from benchmarks import common
from benchmarks import output
from benchmarks import peer_algorithms as peers
from benchmarks import xla_stats
from efficient_attn import feature_maps

# (library mechanism, causal, peer name)
PAIRS = (
    ('softmax', False, 'exact'), ('softmax', True, 'exact'),
    ('softmax_chunked', False, 'exact'), ('softmax_chunked', True, 'exact'),
    ('linear', False, 'linear'), ('linear', True, 'linear_causal'),
    ('performer', False, 'favor'), ('performer', True, 'favor_causal'),
    ('linformer', False, 'linformer'), ('nystrom', False, 'nystromformer'),
)


def define_flags(fv):
  from absl import flags  # pylint: disable=g-import-not-at-top
  flags.DEFINE_list('lengths', ['1024', '4096', '8192'], 'sequence lengths', flag_values=fv)
  flags.DEFINE_list('pairs', [], "only these pairs, e.g. 'performer,linear_causal' (a "
                    "mechanism name, or a peer name); default all", flag_values=fv)
  flags.DEFINE_integer('batch', 1, 'batch size', flag_values=fv)
  flags.DEFINE_integer('heads', 8, 'heads', flag_values=fv)
  flags.DEFINE_integer('head_dim', 64, 'dimension per head', flag_values=fv)
  flags.DEFINE_integer('features', 256, 'random features (performer and FAVOR+)',
                       flag_values=fv)
  flags.DEFINE_integer('landmarks', 64, 'landmarks (nystrom and Nystromformer)',
                       flag_values=fv)
  flags.DEFINE_integer('k_proj', 64, 'projected length (linformer)', flag_values=fv)
  flags.DEFINE_integer('repeats', 5, 'timed calls of each side (alternating)', flag_values=fv)
  flags.DEFINE_float('memory_budget_gb', None,
                     "per program, by XLA's memory analysis (default 60% of RAM)",
                     flag_values=fv)
  flags.DEFINE_string('out', 'benchmark_results', 'output folder', flag_values=fv)
  flags.DEFINE_string('name', 'peers', 'output file stem', flag_values=fv)
  flags.DEFINE_bool('quiet', False, 'no progress lines', flag_values=fv)


def _options(fv) -> Dict[str, Dict[str, Any]]:
  return {'performer': {'num_features': fv.features}, 'nystrom': {'num_landmarks': fv.landmarks},
          'linformer': {'k_proj': fv.k_proj}}


def peer_fn(name: str, n: int, causal: bool, fv):
  """(params, f(params, q, k, v)): the peer and its own random draws (a dict, maybe empty)."""
  key = jax.random.PRNGKey(1)
  if name in ('favor', 'favor_causal'):
    proj = feature_maps.gaussian_projection(key, fv.features, fv.head_dim, orthogonal=True)
    fn = peers.favor if name == 'favor' else peers.favor_causal
    return {}, lambda p, q, k, v: fn(q, k, v, proj)
  if name == 'linformer':
    e, f = jax.random.normal(key, (2, n, fv.k_proj)) / fv.k_proj ** 0.5
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
  q, k, v = common.random_qkv(0, fv.batch, n, fv.heads, fv.head_dim)
  options = _options(fv)
  sides, rows = {}, []
  for mechanism, causal, peer in pairs:
    row = dict(mechanism=mechanism, causal=causal, peer=peer, length=n)
    bench = common.mechanism_bench(mechanism, q, k, v, options=options.get(mechanism),
                                   causal=causal)
    ours_fn, ours_args = bench.forward_backward()
    ours, reason = _compile(ours_fn, ours_args, budget)
    params, fn = peer_fn(peer, n, causal, fv)
    grad = jax.grad(lambda p, q, k, v: jnp.sum(fn(p, q, k, v)), argnums=(0, 1, 2, 3))
    theirs, peer_reason = _compile(grad, (params, q, k, v), budget)
    row['skipped'] = reason and f'library: {reason}' or peer_reason and f'peer: {peer_reason}'
    if not row['skipped']:
      sides[len(rows)] = ((ours, ours_args), (theirs, (params, q, k, v)))
    rows.append(row)
  times = {(i, s): [] for i in sides for s in (0, 1)}
  for i, pair in sides.items():  # pair by pair, its two sides alternating
    for compiled, args in pair:  # warm-up
      common.block(compiled(*args))
    for _ in range(fv.repeats):
      for s, (compiled, args) in enumerate(pair):
        start = time.perf_counter()
        common.block(compiled(*args))
        times[(i, s)].append(time.perf_counter() - start)
  for i, row in enumerate(rows):
    if i in sides:
      row.update(library_s=statistics.median(times[(i, 0)]),
                 peer_s=statistics.median(times[(i, 1)]),
                 library_times_s=times[(i, 0)], peer_times_s=times[(i, 1)])
      row['ratio'] = row['library_s'] / row['peer_s']
  return rows


def _label(row) -> str:
  return f"{row['mechanism']}{' causal' if row['causal'] else ''} vs {row['peer']}"


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  fv = common.parse_flags(define_flags, argv, __doc__)
  lengths = [int(x) for x in fv.lengths]
  pairs = [p for p in PAIRS if not fv.pairs or p[0] in fv.pairs or p[2] in fv.pairs]
  if not pairs:
    raise SystemExit(f'Error: --pairs={",".join(fv.pairs)} matches none of '
                     f'{sorted({p[0] for p in PAIRS} | {p[2] for p in PAIRS})}')
  total = common.total_memory_bytes() or 16 * 2**30
  budget = fv.memory_budget_gb * 2**30 if fv.memory_budget_gb else 0.6 * total
  rows = []
  for n in lengths:
    start = time.perf_counter()
    rows += measure_length(n, pairs, fv, budget)
    if not fv.quiet:
      print(f'length {n}: {time.perf_counter() - start:.0f} s', flush=True)
  info = common.device_info()
  labels = list(dict.fromkeys(_label(r) for r in rows))
  by = {(_label(r), r['length']): r for r in rows}

  def cell(label, n):
    r = by[(label, n)]
    if r['skipped']:
      return 'skipped'
    return (f"{r['ratio']:.2f}x ({output.fmt_time(r['library_s'])} / "
            f"{output.fmt_time(r['peer_s'])})")
  table = output.table(['library vs peer'] + [f'n={n}' for n in lengths],
                       [[lab] + [cell(lab, n) for n in lengths] for lab in labels])
  notes = [f'forward + backward, batch {fv.batch}, {fv.heads} heads, head_dim {fv.head_dim}, '
           f'float32; performer and FAVOR+ {fv.features} features, nystrom and Nystromformer '
           f'{fv.landmarks} landmarks, linformer k = {fv.k_proj}.',
           f'cell: library time / peer time (below 1: the library is faster), medians of '
           f'{fv.repeats} alternating calls each after one warm-up, pair by pair.',
           'peers: `benchmarks/peer_algorithms.py` (exact = `jax.nn.dot_product_attention`, '
           "XLA).",
           'command: python -m benchmarks.peers '
           + ' '.join(sys.argv[1:] if argv is None else argv)]
  skipped = [f"- {_label(r)}, n={r['length']}: {r['skipped']}" for r in rows if r['skipped']]
  markdown = '\n'.join([output.header('The library against its peers', common.describe_device(
      info), notes), table, ''] + (['Skipped:', ''] + skipped + [''] if skipped else []))
  series = {lab: (lengths, [by[(lab, n)].get('ratio') for n in lengths]) for lab in labels}
  output.line_plot(f'{fv.out}/{fv.name}_ratio.png', [('library time / peer time', series)],
                   xlabel='sequence length', ylabel='ratio', hlines=[(1.0, 'parity')])
  data = dict(device=info, flags={f: fv[f].value for f in fv}, rows=rows)
  output.finish(fv.out, fv.name, data, markdown, quiet=fv.quiet)
  return data


if __name__ == '__main__':
  main()
