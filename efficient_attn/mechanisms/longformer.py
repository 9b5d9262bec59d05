"""Longformer attention (Beltagy et al. 2020): a sliding window plus global tokens.

Query i attends to key j iff j is not padded and
  * j is in i's band, the band of `local_attention`: |i - j| <= window // 2,
    or, causal, i - window < j <= i; or
  * j < g (a global token, e.g. a CLS token: attended by every query); or
  * i < g (a global query attends to every key),
with g = min(global_tokens, n), and, causal, always j <= i. Each query takes
ONE softmax over all the keys it sees; a global key inside the band is counted
once. The band is the blocked band of `local.band_blocks` (the same code as
`local_attention`), extended by the g global keys in a joint softmax
(`block_sparse.attend`); the g global query rows are computed densely against
all keys. With g >= n every query is global and this is exact softmax attention.

Cost per head: time O(n (w + g) d), memory O(n (w + g)) (w ~ window, see
`local_attention` for the band's exact block overhead); no n x n array unless
g ~ n. Shapes follow `efficient_attn.registry.Mechanism.attend`.
"""

from typing import Optional

from efficient_attn import registry
from efficient_attn.mechanisms import local
from efficient_attn.mechanisms.softmax import SCALE
from efficient_attn.ops import block_sparse
from efficient_attn.ops import masking
from efficient_attn.ops.scaled_dot_product import default_scale


def longformer_attention(
  q,
  k,
  v,
  mask=None,
  causal: bool = False,
  *,
  window: int = 64,
  global_tokens: int = 1,
  scale: Optional[float] = None,
):
  """Sliding-window attention plus global tokens, exact in the sparse pattern.

  Scores and softmax run in float32 (or wider); the result has the dtype of
  `v`. Queries with no attendable key return 0. The mask is reduced to key
  padding with `masking.key_padding_from_mask`; the pattern comes from
  `window`, `global_tokens` and `causal`.

  Args:
    q: `[batch, n, heads, head_dim]`.
    k: `[batch, n, heads, head_dim]`.
    v: `[batch, n, heads, v_dim]`.
    mask: optional bool key padding `[batch, n]` or flax-style mask; True = attend.
    causal: query i sees keys j <= i only.
    window: band width w >= 1, as in `local_attention`.
    global_tokens: g >= 0, the number of leading positions that attend to and
      are attended by every position (values above n act as n).
    scale: score scale, default 1/sqrt(head_dim).

  Returns:
    `[batch, n, heads, v_dim]`, dtype of `v`.

  Time O(n (w + g) d), memory O(n (w + g)) per head.
  """
  masking.check_inputs(q, k, v, mask, name='longformer_attention', same_length=True)
  registry.check_arguments(
    'longformer', 'longformer_attention', window=window, global_tokens=global_tokens
  )
  b, n, h, d = q.shape
  g = min(global_tokens, n)
  scale = default_scale(d, scale)
  padding = block_sparse.key_padding(mask, b, n)

  def other_rows():
    band = local.band_blocks(q, k, v, padding, window, causal)
    # Global keys leave the band: they are counted in their own segment.
    segments = [band.segment._replace(valid=band.segment.valid & (band.key_pos >= g))]
    if g:
      # Rows i < g are dropped below, so every kept row has i >= g > j: causal holds.
      segments.append(
        block_sparse.Segment('shared', k[:, :g], v[:, :g], padding[:, None, None, None, :g])
      )
    out = block_sparse.attend(band.queries, segments, scale)
    return out.reshape(b, -1, h, out.shape[-1])[:, g:n]

  return block_sparse.global_rows_first(q, k, v, padding, causal, scale, g, other_rows)


@registry.register
class Longformer(registry.Mechanism):
  name = 'longformer'
  rotary = 'scores'
  description = 'sliding window plus global tokens'
  citation = 'Beltagy et al. 2020'
  options = (
    registry.Option('window', 64, int, 'window size w (the band of local attention)', minimum=1),
    registry.Option(
      'global_tokens',
      1,
      int,
      'the first g tokens (e.g. a cls token) attend to and are attended by all',
      minimum=0,
    ),
    SCALE,
  )
  causal = True
  self_attention_only = True
  complexity = ('O(n (w + g) d)', 'O(n (w + g))')
  whole_sequence = 'its global tokens attend to, and are attended by, the whole sequence'
  no_segments = 'its global tokens are the first of the row, not of each document'
  knob = ('window', (16, 32, 64, 128, 256, '2n'))
  example = {'window': 4, 'global_tokens': 1}

  def exact_options(self, length):
    return {'global_tokens': length}

  def attend(self, options, params, q, k, v, *, mask, causal, ctx):
    return longformer_attention(
      q,
      k,
      v,
      mask=mask,
      causal=causal,
      window=options.window,
      global_tokens=options.global_tokens,
      scale=options.scale,
    )
