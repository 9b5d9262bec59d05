"""benchmarks.approx_error's measurement: the relative error of one mechanism against the
exact attention it approximates, over draws of q, k, v, and the sweeps (knob, length,
scale) and identity checks made of it."""

import functools
from typing import Any, Dict, List, Optional, Sequence, Tuple

import jax
import numpy as np

from benchmarks import attention_bench
from benchmarks import output
import efficient_attn as ea


def relative_error(out, ref) -> float:
  """||out - ref||_F / ||ref||_F in float64."""
  out = np.asarray(out, np.float64)
  ref = np.asarray(ref, np.float64)
  return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))


def reference(mechanism: str, options: Dict[str, Any], q, k, v):
  """The exact attention `mechanism` approximates (its declaration's `reference`)."""
  decl = ea.get_mechanism(mechanism)
  return decl.reference(decl.resolve(options), q, k, v)


def resolve(value: Any, length: int) -> Any:
  """'n' -> length, '2n' -> 2 length; other values unchanged."""
  if value == 'n':
    return length
  if value == '2n':
    return 2 * length
  return value


@functools.lru_cache(maxsize=64)
def _compiled(mechanism: str, options: Tuple[Tuple[str, Any], ...], length: int):
  """(jitted init_with_output, jitted apply) of a mechanism, reused across draws."""
  module = attention_bench.build_mechanism(mechanism, length, dict(options))
  return jax.jit(module.init_with_output), jax.jit(module.apply)


def mechanism_output(mechanism: str, options: Dict[str, Any], q, k, v, seed: int):
  """Output of the mechanism's Linen module initialised from `seed` (jitted).

  Random-feature mechanisms also draw their features from `seed`.
  """
  options = dict(options)
  if ea.get_mechanism(mechanism).random_features:
    options.setdefault('seed', seed)
  init, _ = _compiled(mechanism, tuple(sorted(options.items())), k.shape[1])
  out, _ = init(jax.random.PRNGKey(seed), q, k, v)
  return out


def point_error(mechanism: str, options: Dict[str, Any], qkv_draws) -> Tuple[float, float]:
  """(mean, std) relative error over draws [(seed, (q, k, v))]."""
  errors = []
  for seed, (q, k, v) in qkv_draws:
    n = k.shape[1]
    opts = {key: resolve(val, n) for key, val in options.items()}
    out = mechanism_output(mechanism, opts, q, k, v, seed)
    errors.append(relative_error(out, reference(mechanism, opts, q, k, v)))
  return float(np.mean(errors)), float(np.std(errors))


def random_draws(args, length: int, qk_scale: Optional[float] = None):
  """[(seed, (q, k, v))]: v ~ N(0, 1), q and k ~ N(0, qk_scale^2) (default --qk_scale)."""
  scale = args.qk_scale if qk_scale is None else qk_scale
  draws = []
  for s in range(args.seeds):
    q, k, v = attention_bench.random_qkv(
      1000 * s + length, args.batch, length, args.heads, args.head_dim
    )
    draws.append((s, (q * scale, k * scale, v)))
  return draws


# Knobs that stop mattering past a multiple of the length (landmarks, projected
# length and chunks are clamped to n; a window of 2n already covers every key).
LENGTH_BOUNDED = {'num_landmarks': 1, 'k_proj': 1, 'k_chunk': 1, 'q_chunk': 1, 'window': 2}


def knob_values(option: str, values: Sequence[Any], length: int) -> List[Any]:
  """The sweep's values that differ at `length`: bounded knobs above their bound
  dropped (the symbolic 'n' / '2n' kept), duplicates after resolving dropped."""
  keep, seen = [], set()
  bound = LENGTH_BOUNDED.get(option)
  for v in values:
    r = resolve(v, length)
    if bound and isinstance(v, (int, float)) and not isinstance(v, bool) and r > bound * length:
      continue
    if r in seen:
      continue
    seen.add(r)
    keep.append(v)
  return keep


def progress(args, text: str):
  if not args.quiet:
    print(text, flush=True)


def knob_sweep(args, mechanisms, knobs, fixed, draws_by_name) -> List[Dict[str, Any]]:
  """Rows over knobs for each input set {name: (length, [(seed, qkv) or per-layer])}."""
  rows = []
  for inputs_name, (length, draws) in draws_by_name.items():
    for m in mechanisms:
      if m not in knobs:
        continue
      option, values = knobs[m]
      for value in knob_values(option, values, length):
        opts = dict(fixed.get(m, {}), **{option: value})
        row = dict(
          inputs=inputs_name,
          mechanism=m,
          option=option,
          value=value,
          resolved=resolve(value, length),
          length=length,
        )
        try:
          if isinstance(draws, dict):  # checkpoint: per layer
            per_layer = {name: point_error(m, opts, d)[0] for name, d in draws.items()}
            row.update(
              error=float(np.mean(list(per_layer.values()))),
              std=float(np.std(list(per_layer.values()))),
              per_layer=per_layer,
            )
          else:
            row['error'], row['std'] = point_error(m, opts, draws)
        except Exception as e:  # pylint: disable=broad-except  (recorded, sweep continues)
          row.update(error=None, std=None, reason=f'{type(e).__name__}: {str(e)[:160]}')
        rows.append(row)
        progress(
          args,
          f'[knob] {inputs_name:28s} {m:16s} {option}={value!s:8s} '
          f'error {output.fmt_num(row["error"], 3)}',
        )
  return rows


def length_sweep(args, mechanisms, fixed, lengths) -> List[Dict[str, Any]]:
  rows = []
  for n in lengths:
    draws = random_draws(args, n)
    for m in mechanisms:
      row = dict(mechanism=m, length=n, options=fixed.get(m, {}))
      try:
        row['error'], row['std'] = point_error(m, fixed.get(m, {}), draws)
      except Exception as e:  # pylint: disable=broad-except
        row.update(error=None, std=None, reason=f'{type(e).__name__}: {str(e)[:160]}')
      rows.append(row)
      progress(args, f'[length] {m:16s} n={n:6d} error {output.fmt_num(row["error"], 3)}')
  return rows


def scale_sweep(args, mechanisms, fixed, scales) -> List[Dict[str, Any]]:
  """Error against the scale of q and k (logits q.k / sqrt(d) have std scale^2)."""
  rows = []
  for scale in scales:
    draws = random_draws(args, args.knob_length, scale)
    for m in mechanisms:
      row = dict(mechanism=m, qk_scale=scale, length=args.knob_length)
      try:
        row['error'], row['std'] = point_error(m, fixed.get(m, {}), draws)
      except Exception as e:  # pylint: disable=broad-except
        row.update(error=None, std=None, reason=f'{type(e).__name__}: {str(e)[:160]}')
      rows.append(row)
      progress(
        args, f'[scale] {m:16s} qk_scale={scale:<5g} error {output.fmt_num(row["error"], 3)}'
      )
  return rows


def identity_checks(args, mechanisms) -> List[Dict[str, Any]]:
  n = min(args.knob_length, 256)
  draws = random_draws(args, n)[:1]
  rows = []
  for m in mechanisms:
    opts = ea.get_mechanism(m).exact_options(n)
    if opts is None:
      continue
    label = f'{m}, ' + ', '.join(f'{k}={v}' for k, v in opts.items())
    err, _ = point_error(m, opts, draws)
    rows.append(dict(check=label, mechanism=m, options=opts, length=n, error=err))
    progress(args, f'[identity] {label:55s} n={n} error {err:.3g}')
  return rows
