"""The per-head shapes of an attention layer: heads, grouped-query key/value heads, the
mechanism's declared query/key and value widths, and the checks of q, k, v against them.

Shared by the Linen and NNX layers (`efficient_attn.layers.linen`, `.nnx`), the mechanism
call (`efficient_attn.layers.multi_head`) and the trainer's attention checks.
"""

from typing import NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp

from efficient_attn import registry
from efficient_attn.ops import masking


def head_dim(num_heads: int, qkv_features: int) -> int:
  """qkv_features // num_heads, or ValueError when the heads do not divide the width."""
  if num_heads < 1 or qkv_features % num_heads:
    raise ValueError(
      f'num_heads={num_heads} must divide the attention width '
      f'{qkv_features} (qkv_features / d_model)'
    )
  return qkv_features // num_heads


def kv_heads(
  decl: registry.Mechanism, projection: str, num_heads: int, num_kv_heads: Optional[int]
) -> int:
  """Key/value heads of grouped-query attention (Ainslie et al. 2023), checked.

  None means num_heads (multi-head attention). Fewer heads need a divisor of
  num_heads, the 'standard' projection (the only scheme that projects keys and
  values into heads) and a mechanism whose keys are not its queries.
  """
  if num_kv_heads is None or num_kv_heads == num_heads:
    return num_heads
  if num_kv_heads < 1 or num_heads % num_kv_heads:
    raise ValueError(
      f'num_heads ({num_heads}) must be divisible by num_kv_heads '
      f'({num_kv_heads}); valid: a divisor of {num_heads}'
    )
  if projection != 'standard':
    raise ValueError(
      f'num_kv_heads={num_kv_heads}: grouped-query attention needs '
      f"projection 'standard' (the only scheme with key and value projections "
      f'into heads), not {projection!r}'
    )
  if decl.shared_qk:
    raise ValueError(
      f'num_kv_heads={num_kv_heads}: mechanism {decl.name!r} uses the queries '
      f'as keys, so keys cannot have fewer heads'
    )
  return num_kv_heads


class HeadLayout(NamedTuple):
  """The per-head shapes of one layer: `heads` heads of `head_dim` (qkv_features / heads),
  `kv_heads` key/value heads (grouped-query attention), and the mechanism's declared
  `qk_heads` x `qk_dim` queries and keys and `v_dim` values (`Mechanism.head_shapes`)."""

  heads: int
  head_dim: int
  kv_heads: int
  qk_heads: int
  qk_dim: int
  v_dim: int

  def features(self, name: str) -> Tuple[int, int]:
    """The `(heads, dim)` that the projection `name` ('query', 'key', 'value') maps to."""
    if name == 'query':
      return self.qk_heads, self.qk_dim
    if name == 'key':
      return (self.kv_heads if self.qk_heads == self.heads else self.qk_heads), self.qk_dim
    return self.kv_heads, self.v_dim


def shape_options(
  decl: registry.Mechanism, options: registry.Options, heads: int, head_dim: int
) -> str:
  """'mechanism 'x' with a=1, b=2': the options that set its head shapes (those whose
  default gives other shapes)."""
  shapes = decl.head_shapes(options, heads=heads, head_dim=head_dim)
  named = [
    f'{opt.name}={options[opt.name]!r}'
    for opt in decl.options
    if options[opt.name] != opt.default
    and decl.head_shapes(
      registry.Options({**options, opt.name: opt.default}), heads=heads, head_dim=head_dim
    )
    != shapes
  ]
  return f'mechanism {decl.name!r}' + (f' with {", ".join(named)}' if named else '')


def head_layout(
  decl: registry.Mechanism,
  options: registry.Options,
  *,
  projection: str,
  heads: int,
  head_dim: int,
  kv_heads: int,
) -> HeadLayout:
  """The layer's `HeadLayout`: the mechanism's `head_shapes`, checked against the
  projection scheme and grouped-query attention (`kv_heads`, from `kv_heads`).

  Raises a one-line ValueError naming the options, the scheme and the valid ones:
  query/key groups that do not divide `heads`; queries and keys other than `heads` x
  `head_dim` without a key projection ('efficient' and 'super' slice the keys into
  heads); values other than `head_dim` wide without a value projection (only
  'standard' has one); shared query/key groups together with fewer key/value heads.
  """
  qk_heads, qk_dim, v_dim = decl.head_shapes(options, heads=heads, head_dim=head_dim)
  layout = HeadLayout(heads, head_dim, kv_heads, qk_heads, qk_dim, v_dim)
  if (qk_heads, qk_dim, v_dim) == (heads, head_dim, head_dim):
    return layout
  which = shape_options(decl, options, heads, head_dim)
  if qk_heads < 1 or heads % qk_heads:
    divisors = ', '.join(str(i) for i in range(1, heads + 1) if heads % i == 0)
    raise ValueError(
      f'{which}: {qk_heads} query/key groups do not divide num_heads={heads}; valid: {divisors}'
    )
  with_keys = ('standard', 'optimised')
  if (qk_heads, qk_dim) != (heads, head_dim) and projection not in with_keys:
    raise ValueError(
      f'{which} projects queries and keys to (qk_heads, qk_dim) = '
      f'{(qk_heads, qk_dim)}, not (num_heads, head_dim) = {(heads, head_dim)}, '
      f'which needs a key projection: projection {projection!r} slices keys '
      f'into heads; valid: {", ".join(map(repr, with_keys))}'
    )
  if v_dim != head_dim and projection != 'standard':
    raise ValueError(
      f'{which} has values of {v_dim} per head (not head_dim={head_dim}), '
      f'which needs a value projection: projection {projection!r} slices '
      f"values into heads; valid: 'standard'"
    )
  if qk_heads != heads and kv_heads != heads:
    raise ValueError(
      f'{which} shares {qk_heads} query/key group(s) among {heads} heads, '
      f'which grouped-query attention (num_kv_heads={kv_heads}) cannot '
      f'combine with; valid: num_kv_heads=None (or {heads})'
    )
  return layout


def repeat_kv(q, k, v):
  """k, v `[batch, length, kv_heads, d]` repeated to q's heads (grouped-query attention:
  query head i reads key/value head i // (heads / kv_heads)). q and k with the same
  heads pass unchanged (groups of queries and keys shared by v's heads)."""
  h, hk = q.shape[-2], k.shape[-2]
  if hk == h:
    return k, v
  if h % hk or v.shape[-2] != hk:
    raise ValueError(
      f'queries have {h} heads, keys {hk} and values {v.shape[-2]}: key and '
      f'value heads must be equal and divide the query heads'
    )
  return jnp.repeat(k, h // hk, axis=-2), jnp.repeat(v, h // hk, axis=-2)


def state_heads(
  decl: registry.Mechanism, options: registry.Options, heads: int, kv_heads: int
) -> int:
  """Heads of the decoding state: kv_heads for a key/value cache or a state that depends
  on keys and values alone (`grouped_state`), else one per query head."""
  return kv_heads if decl.decode == 'kv_cache' or decl.grouped_state(options) else heads


def check_inputs(
  decl: registry.Mechanism,
  q,
  k,
  v,
  mask,
  *,
  stepping: bool = False,
  options: Optional[registry.Options] = None,
  head_dim: Optional[int] = None,
) -> Tuple[int, int]:
  """One-line errors for inconsistent q, k, v and mask shapes (see `masking.check_inputs`);
  k and v may have fewer heads than q, a divisor (grouped-query attention).

  With the `options`, q, k and v must also have the shapes the mechanism declares
  (`Mechanism.head_shapes`) for the layer's `head_dim` (None: q's) where those differ
  from the default, e.g. q and k with fewer heads than v (shared groups).

  Returns (heads, head_dim): the layer's heads (q's, or v's where q and k are shared
  groups) and head_dim.
  """
  if not q.ndim == k.ndim == v.ndim == 4:
    masking.check_inputs(q, k, v, mask, name=f'mechanism {decl.name!r}')  # raises
  heads, head_dim = max(q.shape[2], v.shape[2]), head_dim or q.shape[3]
  grouped = False
  if options is not None:
    qk_heads, qk_dim, v_dim = decl.head_shapes(options, heads=heads, head_dim=head_dim)
    grouped = qk_heads < heads
    # Grouped-query attention (heads per query/key, not shared groups): k and v may have
    # fewer heads, the same divisor of heads for both.
    kv = (
      k.shape[2]
      if (not grouped and k.shape[2] == v.shape[2] and k.shape[2] and heads % k.shape[2] == 0)
      else None
    )
    if (qk_heads, qk_dim, v_dim) != (heads, head_dim, head_dim) and (
      q.shape[2:] != (qk_heads, qk_dim)
      or k.shape[2:] not in ((qk_heads, qk_dim), (kv, qk_dim))
      or v.shape[2:] not in ((heads, v_dim), (kv, v_dim))
    ):
      raise ValueError(
        f'{shape_options(decl, options, heads, head_dim)} takes q and k [batch, length, '
        f'{qk_heads}, {qk_dim}] and v [batch, length, {heads}, {v_dim}] for {heads} heads '
        f'of head_dim={head_dim}, got q {tuple(q.shape)}, k {tuple(k.shape)}, '
        f'v {tuple(v.shape)} (a layer whose head_dim is not q\'s passes head_dim)'
      )
  if k.shape[2] == v.shape[2] and k.shape[2] and q.shape[2] % k.shape[2] == 0:
    k, v = (jax.ShapeDtypeStruct(x.shape[:2] + q.shape[2:3] + x.shape[3:], x.dtype) for x in (k, v))
  masking.check_inputs(
    q,
    k,
    v,
    mask,
    name=f'mechanism {decl.name!r}',
    same_length=decl.self_attention_only and not stepping,
    qk_groups=grouped,
  )
  return heads, head_dim
