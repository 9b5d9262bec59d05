r"""The gated family against flash-linear-attention's kernels: forward + backward and decoding.

For each recurrence, the bare chunkwise core (no projections, convolution or norm: what
fla's `chunk_*` ops compute) on the same random inputs:

  ours   `efficient_attn.ops.gated` / `efficient_attn.ops.delta` / `efficient_attn.ops.dplr`
         chunk form with implementation 'xla' and 'pallas' (`efficient_attn.ops.kernels`), in
         bfloat16 and float32 inputs;
  fla    `fla.ops` (PyTorch + Triton) as published (`benchmarks.published.fla`), bfloat16.

    recurrence          ours                                   fla
    retention           scalar decay, fixed per head          chunk_retention
    mamba2              scalar decay from the token (SSD)     chunk_simple_gla (g [B, T, H])
    gla                 decay per key feature                  chunk_gla (g [B, T, H, K])
    deltanet            delta rule                             chunk_delta_rule
    gated_deltanet      delta rule with a scalar decay         chunk_gated_delta_rule
    kda                 delta rule with a decay per key        chunk_kda (g [B, T, H, K])
                        feature (Kimi Delta Attention)
    gated_deltaproduct  n_h = 2 delta steps a token, one      chunk_gated_delta_product
                        scalar decay, beta in (0, 2)           (k, v, beta [B, T n_h, H, ...])
    rwkv7               DPLR: decay per key feature, a = -     chunk_rwkv7 (as its layer:
                        kappa, b = alpha kappa (no Pallas)     safe_gate, chunk 64)

The inputs are the mechanisms' (`benchmarks.fla_peer_inputs`): delta-rule keys
L2-normalised, beta in (0, 1) (Gated DeltaProduct: (0, 2), fla's layer's allow_neg_eigval),
RWKV-7's log-decay in (-exp(-1/2), 0) and kappa L2-normalised. fla reads q, k, v (RWKV-7's
a and b too, as its layer gives them) in bfloat16 and the other gates in float32; Gated
DeltaProduct's keys, values and betas as fla's interleaved substeps, its chunks 64 substeps
on both sides (ours: --chunk_size // n_h tokens). RWKV-7 has no Pallas kernel: its 'pallas'
cells are skipped with that reason.

Forward + backward is the gradient of sum(out * do) with respect to q, k, v and the gates
(decays, beta, RWKV-7's pairs), timed as the median of --repeats calls after a warm-up (CUDA
events for fla, `block_until_ready` for JAX). Decoding is one token's step with a state of
its size, per token (fla's fused recurrent op; Gated DeltaProduct's, as fla's layer decodes
it, the gated delta rule's on the token's n_h substeps; RWKV-7's, fused_recurrent_rwkv7).
Memory is XLA's compiled footprint (arguments + outputs + temporaries) for ours and torch's
peak allocation for fla.

Head layouts (--layouts): 'heads' is --heads heads of --head_dim for q, k and v (the issue's
batch 4, 16 heads of 128); 'paper' is each paper's own: Mamba-2 with ngroups=1 (one B and C
of d_state 128 shared by 32 heads of 64 values, repeated to the heads for both sides), Gated
DeltaNet as fla's default (6 heads, keys of 256, values of 512); the others keep 'heads'.
Lengths of 64K and over run at batch 1.

    python -m benchmarks.fla_peer --out=docs/results --name=gated_gpu        # on a GPU
    python -m benchmarks.fla_peer --dry_run --out=/tmp/fla_dry                # any machine

--dry_run runs every part at tiny sizes (on CPU, 'pallas' in interpret mode); fla is
skipped with one line wherever it cannot run (no source, no torch, no GPU).
"""

from typing import Any, Dict, List

from absl import flags

from benchmarks import common
from benchmarks import fla_peer_fla
from benchmarks import fla_peer_inputs
from benchmarks import fla_peer_ours
from benchmarks import machine
from benchmarks import output
from benchmarks.published import fla as published_fla

RECURRENCES = (
  'retention',
  'mamba2',
  'gla',
  'deltanet',
  'gated_deltanet',
  'kda',
  'gated_deltaproduct',
  'rwkv7',
)
IMPLEMENTATIONS = ('xla', 'pallas')
DTYPES = ('bfloat16', 'float32')
LAYOUTS = ('heads', 'paper')
LONG = 65536  # from this length on, batch 1


def define_flags(fv: flags.FlagValues) -> None:
  common.define_output_flags(fv, out='benchmark_results/fla_peer', name='gated_gpu')
  flags.DEFINE_string(
    'recurrences', ','.join(RECURRENCES), 'comma list of: ' + ', '.join(RECURRENCES), flag_values=fv
  )
  flags.DEFINE_string(
    'implementations',
    ','.join(IMPLEMENTATIONS),
    'ours, comma list of: ' + ', '.join(IMPLEMENTATIONS),
    flag_values=fv,
  )
  flags.DEFINE_string(
    'dtypes', ','.join(DTYPES), 'our input dtypes (fla: bfloat16)', flag_values=fv
  )
  flags.DEFINE_string(
    'lengths', '4096,16384,65536', f'comma list; >= {LONG} at batch 1', flag_values=fv
  )
  flags.DEFINE_string(
    'layouts', 'heads,paper', 'comma list of: ' + ', '.join(LAYOUTS), flag_values=fv
  )
  flags.DEFINE_integer('batch', 4, 'batch below 64K tokens', flag_values=fv)
  flags.DEFINE_integer('heads', 16, "heads of the 'heads' layout", flag_values=fv)
  flags.DEFINE_integer('head_dim', 128, "q, k and v width of the 'heads' layout", flag_values=fv)
  flags.DEFINE_integer('chunk_size', 64, 'chunk of every chunkwise form (fla: 64)', flag_values=fv)
  flags.DEFINE_integer(
    'repeats', 10, 'timed calls per point (median)', lower_bound=1, flag_values=fv
  )
  flags.DEFINE_float('budget_s', 20.0, 'seconds of timed calls per point at most', flag_values=fv)
  flags.DEFINE_bool('decode', True, 'also time one decoding step', flag_values=fv)
  flags.DEFINE_bool(
    'fla',
    True,
    "also time fla's kernels (skipped in one line where they cannot run)",
    flag_values=fv,
  )
  flags.DEFINE_bool(
    'dry_run',
    False,
    'tiny sizes (lengths 64 and 96, batch 1, 2 heads of '
    '16, chunk 16, 2 repeats): every part, on any machine',
    flag_values=fv,
  )


def check_flags(fv) -> Dict[str, Any]:
  """The flags' lists, or a one-line ValueError naming a bad value and the valid ones."""
  picked = {}
  for flag, valid in (
    ('recurrences', RECURRENCES),
    ('implementations', IMPLEMENTATIONS),
    ('dtypes', DTYPES),
    ('layouts', LAYOUTS),
  ):
    values = common.csv_list(getattr(fv, flag), flag=flag)
    bad = [x for x in values if x not in valid]
    if bad or not values:
      raise ValueError(
        f'--{flag}={getattr(fv, flag)!r} is not valid; valid values: {", ".join(valid)}'
      )
    picked[flag] = values
  picked['lengths'] = common.csv_list(fv.lengths, int, flag='lengths')
  for flag, value in (
    ('batch', fv.batch),
    ('heads', fv.heads),
    ('head_dim', fv.head_dim),
    ('chunk_size', fv.chunk_size),
    ('repeats', fv.repeats),
  ):
    if value < 1:
      raise ValueError(f'--{flag}={value} is not valid; it must be >= 1')
  if min(picked['lengths']) < 1:
    raise ValueError(f'--lengths={fv.lengths!r} is not valid; every length must be >= 1')
  return picked


def run(fv) -> Dict[str, Any]:
  with common.flag_errors():
    picked = check_flags(fv)
  heads, head_dim, chunk, repeats, batch = (
    fv.heads,
    fv.head_dim,
    fv.chunk_size,
    fv.repeats,
    fv.batch,
  )
  if fv.dry_run:
    picked['lengths'], heads, head_dim, chunk, repeats, batch = [64, 96], 2, 16, 16, 2, 1
  say = (lambda *a: None) if fv.quiet else (lambda text: common.emit(text))
  reason = published_fla.why_missing() if fv.fla else '--nofla'
  ops = None
  if reason:
    say(f'fla skipped: {reason}')
  else:
    ops = published_fla.ops()
  rows: List[Dict[str, Any]] = []
  for layout in picked['layouts']:
    for recurrence in picked['recurrences']:
      s = fla_peer_inputs.shapes(recurrence, layout, heads, head_dim)
      if fv.dry_run:
        s = {k: min(v, 4 if k == 'heads' else 16) for k, v in s.items()}
        s['qk_groups'] = 1 if s['qk_groups'] < s['heads'] else s['heads']
      if layout == 'paper' and recurrence not in ('mamba2', 'gated_deltanet'):
        continue
      for length in picked['lengths']:
        b = 1 if length >= LONG else batch
        data = fla_peer_inputs.inputs(recurrence, b, length, s)
        row = dict(recurrence=recurrence, layout=layout, length=length, batch=b, **s)
        for impl in picked['implementations']:
          core = fla_peer_ours.our_core(recurrence, impl)
          for dtype in picked['dtypes']:
            key = f'{impl}_{dtype}'
            if core is None:
              row[key] = dict(skipped=f'{recurrence} has no {impl} form (no kernel)')
              continue
            try:
              row[key] = fla_peer_ours.time_ours(
                core, *data, dtype=dtype, chunk_size=chunk, repeats=repeats, budget_s=fv.budget_s
              )
            except Exception as e:  # pylint: disable=broad-except
              row[key] = dict(failed=f'{type(e).__name__}: {str(e).splitlines()[0][:200]}')
        if ops is not None:
          try:
            row['fla_bfloat16'] = fla_peer_fla.time_fla(ops, recurrence, *data, repeats=repeats)
          except Exception as e:  # pylint: disable=broad-except
            row['fla_bfloat16'] = dict(failed=f'{type(e).__name__}: {str(e)[:200]}')
        if fv.decode and length == picked['lengths'][0]:
          row['decode_ours_s'] = fla_peer_ours.time_our_step(recurrence, *data, repeats=repeats)
          if ops is not None:
            row['decode_fla_s'] = fla_peer_fla.time_fla_step(
              ops, recurrence, *data, repeats=repeats
            )
        rows.append(row)
        say(
          f'{recurrence} {layout} n={length}: '
          + ', '.join(
            f'{k} {v["time_s"] * 1e3:.3g} ms'
            for k, v in row.items()
            if isinstance(v, dict) and 'time_s' in v
          )
        )
  measured = [r for r in rows for v in r.values() if isinstance(v, dict) and 'time_s' in v]
  if not measured:
    raise SystemExit('Error: every point failed or was skipped; nothing to report')
  return dict(
    rows=rows,
    fla=dict(published_fla.FLA, skipped=reason or ''),
    device=machine.device_info(),
    chunk_size=chunk,
    dry_run=fv.dry_run,
  )


def markdown(result: Dict[str, Any]) -> str:
  """One row per recurrence, layout and length: milliseconds per forward + backward, the
  ratio of each of ours to fla's, and decoding latency per token."""
  columns = sorted(
    {k for r in result['rows'] for k, v in r.items() if isinstance(v, dict) and k != 'fla_bfloat16'}
  )
  has_fla = any('fla_bfloat16' in r for r in result['rows'])
  headers = (
    ['recurrence', 'layout', 'B x T x H x (dk, dv)']
    + [f'{c} ms' for c in columns]
    + (['fla bfloat16 ms'] + [f'{c} / fla' for c in columns] if has_fla else [])
    + ['decode ours us', 'decode fla us']
  )

  def ms(cell):
    if not isinstance(cell, dict):
      return '-'
    return (
      f"{cell['time_s'] * 1e3:.3g}"
      if 'time_s' in cell
      else 'skipped'
      if 'skipped' in cell
      else 'failed'
    )

  body = []
  for r in result['rows']:
    fla = r.get('fla_bfloat16', {})
    ratios = (
      [
        f"{r[c]['time_s'] / fla['time_s']:.2f}"
        if 'time_s' in r.get(c, {}) and 'time_s' in fla
        else '-'
        for c in columns
      ]
      if has_fla
      else []
    )
    us = lambda key: f'{r[key] * 1e6:.1f}' if key in r else '-'
    body.append(
      [
        r['recurrence'],
        r['layout'],
        f"{r['batch']} x {r['length']} x {r['heads']} x ({r['dk']}, {r['dv']})"
        + (f", n_h {r['num_householder']}" if 'num_householder' in r else ''),
      ]
      + [ms(r.get(c)) for c in columns]
      + ([ms(fla)] + ratios if has_fla else [])
      + [us('decode_ours_s'), us('decode_fla_s')]
    )
  return output.table(headers, body)


def main(argv=None) -> None:
  fv = common.parse_flags(define_flags, argv, __doc__)
  result = run(fv)
  notes = [
    f"fla: {result['fla']['repo']} at {result['fla']['commit'][:12]}"
    + (f" (skipped: {result['fla']['skipped']})" if result['fla']['skipped'] else ''),
    f"chunk {result['chunk_size']}; forward + backward of sum(out * do) w.r.t. q, k, v "
    f'and the gates; decoding: one step with a float32 state',
  ]
  output.finish_table(
    fv.out,
    fv.name,
    'The gated family against fla',
    machine.describe_device(result['device']),
    notes,
    markdown(result),
    result,
    quiet=fv.quiet,
  )


if __name__ == '__main__':
  main()
