"""The collectives of a sequence split over a mesh axis, inside `jax.shard_map` over it.

Written against `jax.lax` and the axis name; `efficient_attn.layers.parallel` runs a
mechanism's `attend_sharded` in the `shard_map` that gives them their axis:

  * `ring_attention`: exact softmax, the key/value blocks passed around the ring
    (`lax.ppermute`), each block's (output, log-sum-exp) merged as an online
    softmax (Liu et al. 2023, "Ring Attention with Blockwise Transformers"); causal, in
    the zigzag layout (`to_zigzag`), so every device does the same work;
  * `exclusive_scan`: each device's incoming state from the summaries of the blocks
    before it, for any associative combination (a prefix sum of kernel states, a
    decayed state, a composed state transition), in log2(devices) rounds;
  * `halo_before` / `halo_after`: the tokens just before (after) the block, from the
    neighbouring devices, zeros past the ends (a sliding window, a short convolution).
"""

import functools
from typing import Any, Callable, NamedTuple

import jax
from jax import lax
import jax.numpy as jnp

from efficient_attn.ops import masking


def shift(x, offset: int, axis: str):
  """Each device's `x` from the device `offset` places before it on `axis` (after it for a
  negative offset), zeros where there is none (a pytree of arrays)."""
  n = lax.axis_size(axis)
  if offset >= 0:
    perm = [(j, j + offset) for j in range(n - offset)]
  else:
    perm = [(j, j + offset) for j in range(-offset, n)]
  if not perm:
    return jax.tree.map(jnp.zeros_like, x)
  return jax.tree.map(lambda a: _as(lax.ppermute(_int(a), axis, perm), a), x)


def _int(a):
  return a.astype(jnp.int32) if a.dtype == jnp.bool_ else a


def _as(a, like):
  return a.astype(like.dtype)


def rotate(x, axis: str):
  """Each device's `x` from the previous device on `axis`, the first from the last."""
  n = lax.axis_size(axis)
  perm = [(j, (j + 1) % n) for j in range(n)]
  return jax.tree.map(lambda a: _as(lax.ppermute(_int(a), axis, perm), a), x)


def _zigzag_perms(n: int):
  """Where the halves of each device's block go in the zigzag layout: chunk c of the 2n
  chunks (device c // 2's half c % 2) goes to device c if c < n, else to 2n - 1 - c.
  Returns the permutations of the first halves (even chunks) and of the second (odd)."""
  home = lambda c: c if c < n else 2 * n - 1 - c
  return ([(j, home(2 * j)) for j in range(n)], [(j, home(2 * j + 1)) for j in range(n)])


def to_zigzag(x, axis: str):
  """Each device's contiguous block `[b, m, ...]` (m even) rearranged so that device i holds
  chunks i and 2n - 1 - i of the 2n chunks of m / 2 tokens (a pytree of arrays): the
  causal ring's work is then the same on every device (the balance that Brandon et al.
  2023 get by striping tokens instead). Two collective permutes of half a block each."""
  n, i = lax.axis_size(axis), lax.axis_index(axis)
  first, second = _zigzag_perms(n)
  even = i % 2 == 0

  def one(a):
    h = a.shape[1] // 2
    got_even = _as(lax.ppermute(_int(a[:, :h]), axis, first), a)  # chunk i or 2n - 1 - i
    got_odd = _as(lax.ppermute(_int(a[:, h:]), axis, second), a)
    return jnp.where(
      even, jnp.concatenate([got_even, got_odd], 1), jnp.concatenate([got_odd, got_even], 1)
    )

  return jax.tree.map(one, x)


def from_zigzag(x, axis: str):
  """The inverse of `to_zigzag`: each device's contiguous block again."""
  n, i = lax.axis_size(axis), lax.axis_index(axis)
  first, second = _zigzag_perms(n)
  back = lambda perm: [(d, j) for j, d in perm]
  even = i % 2 == 0

  def one(a):
    h = a.shape[1] // 2
    came_even = jnp.where(even, a[:, :h], a[:, h:])  # what `first` brought
    came_odd = jnp.where(even, a[:, h:], a[:, :h])
    return jnp.concatenate(
      [
        _as(lax.ppermute(_int(came_even), axis, back(first)), a),
        _as(lax.ppermute(_int(came_odd), axis, back(second)), a),
      ],
      1,
    )

  return jax.tree.map(one, x)


def halo_before(x, size: int, axis: str):
  """The `size` tokens before this device's block `x` `[b, m, ...]` (axis 1), from the
  devices before it: `[b, size, ...]`, zeros before the sequence's start. Each device
  sends only the tokens that fall in the halo (the nearest neighbour its last ones)."""
  if not size:
    return x[:, :0]
  m = x.shape[1]
  hops = min(-(-size // m), lax.axis_size(axis) - 1)
  parts = [shift(x[:, m - min(m, size - (h - 1) * m) :], h, axis) for h in range(hops, 0, -1)]
  pad = max(0, size - hops * m)
  if pad:
    parts.insert(0, jnp.zeros((x.shape[0], pad) + x.shape[2:], x.dtype))
  return jnp.concatenate(parts, axis=1)


def halo_after(x, size: int, axis: str):
  """The `size` tokens after this device's block `x` `[b, m, ...]`, from the devices after
  it: `[b, size, ...]`, zeros past the sequence's end. Each device sends only the tokens
  that fall in the halo."""
  if not size:
    return x[:, :0]
  m = x.shape[1]
  hops = min(-(-size // m), lax.axis_size(axis) - 1)
  parts = [shift(x[:, : min(m, size - (h - 1) * m)], -h, axis) for h in range(1, hops + 1)]
  pad = max(0, size - hops * m)
  if pad:
    parts.append(jnp.zeros((x.shape[0], pad) + x.shape[2:], x.dtype))
  return jnp.concatenate(parts, axis=1)


def with_halo(x, before: int, after: int, axis: str):
  """`x` `[b, m, ...]` with `before` tokens of the previous devices in front and `after`
  of the next ones behind (zeros past the sequence's ends)."""
  return jnp.concatenate([halo_before(x, before, axis), x, halo_after(x, after, axis)], 1)


def exclusive_scan(combine: Callable[[Any, Any], Any], summary, identity, axis: str):
  """The combination of the summaries of every device before this one on `axis`
  (`identity` on the first): device i gets s_0 . s_1 . ... . s_{i-1}, where
  `combine(earlier, later)` is associative and `summary` a pytree.

  Hillis-Steele doubling: log2(devices) rounds of one `lax.ppermute` each, then a shift.
  """
  n, i = lax.axis_size(axis), lax.axis_index(axis)
  x, d = summary, 1
  while d < n:
    earlier = shift(x, d, axis)
    x = _select(i >= d, combine(earlier, x), x)
    d *= 2
  return _select(i >= 1, shift(x, 1, axis), identity)


def _select(pred, a, b):
  return jax.tree.map(lambda x, y: jnp.where(pred, x, y), a, b)


def merge_softmax(out1, lse1, out2, lse2):
  """Two softmax attentions over disjoint key sets as one: outputs `[b, q, h, dv]` and
  log-sum-exps `[b, h, q]` (`masking.big_neg` for a row with no key, output 0)."""
  m = lax.stop_gradient(jnp.maximum(lse1, lse2))
  w1, w2 = jnp.exp(lse1 - m), jnp.exp(lse2 - m)
  total = w1 + w2
  weight = lambda w: jnp.swapaxes(w / total, 1, 2)[..., None]  # [b, q, h, 1]
  return out1 * weight(w1) + out2 * weight(w2), m + jnp.log(total)


class RingBlock(NamedTuple):
  """How ring attention attends to one block of keys (softmax's dense or blocked form).

  forward(q, k, v, key_padding, causal[, documents][, bias=]) -> (out `[b, m, h, dv]`, lse
    `[b, h, m]`): softmax attention of the (scaled) queries over this block of keys, and
    each row's log-sum-exp (`masking.big_neg` for a row with no key, output 0); causal: the
    diagonal block (key j <= query i); documents, passed only for a packed row: the
    `masking.document_pair` of the queries and this block's keys (a query sees its own
    document's keys); bias, passed only when the ring has one: (the queries' bias `[b, h,
    m]`, this block's keys' `[b, h, m]`), added to every score (`flash`'s). Not
    differentiated.
  backward(q, k, v, key_padding, causal, out, lse, g[, documents][, bias=]) -> (dq, dk, dv),
    and with bias (dq, dk, dv, d query bias, d key bias): this block's share of the
    gradients of the whole attention, whose output is `out` and log-sum-exp `lse` (+inf for
    a row with no key), for the output cotangent g.
  """

  forward: Callable[..., Any]
  backward: Callable[..., Any]


def ring_attention(
  q, k, v, key_padding, *, causal: bool, axis: str, block: RingBlock, documents=None, bias=None
):
  """Exact softmax attention of this device's queries over every device's keys (ring
  attention, Liu et al. 2023): the key/value blocks travel around the ring (`rotate`),
  and each visiting block's `block.forward` is merged by `merge_softmax`.

  q `[b, m, h, d]` (scaled), k `[b, m, h, d]`, v `[b, m, h, dv]`, key_padding bool
  `[b, m]` or None (True = real key) -> `[b, m, h, dv]`. documents: None, or this block's
  document index `[b, m]` (of the whole row: `ops.segments.document_index` before the
  split): a packed row, where a query sees only its own document's real keys and a
  padded query's output is 0. The key blocks then travel with their documents, and a
  visiting block whose documents cannot meet the queries' (`masking.ranges_meet`) is
  skipped. Causal: the blocks are first
  rearranged in the zigzag layout (`to_zigzag`, where m is even), so that every visiting
  block costs each device m x m / 2 scores: all its queries against the visitor's first
  half (a block from an earlier device), or its second half of queries against the whole
  visitor (a later one); the device's own block takes the causal mask. With m odd, the
  blocks stay contiguous: earlier devices' blocks whole, later ones skipped (`lax.cond`),
  so the last device does n times the first's work. The backward pass is a second ring
  (`jax.custom_vjp`): the key/value blocks travel again with their gradients, each device
  adding its queries' share (`block.backward`), so only this device's blocks, output and
  log-sum-exp are kept.

  bias: None, or (query bias, key bias), each `[b, m, h]` (this device's tokens), added to
  every score: s_ij + (query bias_i + key bias_j), e.g. Forgetting Attention's F_i - F_j
  (`efficient_attn.mechanisms.forgetting`). The key bias travels with its keys, and its
  gradient with theirs.
  """
  if key_padding is None:
    key_padding = jnp.ones(k.shape[:2], bool)
  if documents is not None:
    documents = masking.document_pair(documents, key_padding, key_padding)
  zigzag = causal and lax.axis_size(axis) > 1 and q.shape[1] % 2 == 0
  if zigzag:
    q, k, v, key_padding, documents, bias = to_zigzag((q, k, v, key_padding, documents, bias), axis)
  if bias is not None:  # [b, h, m], as a log-sum-exp: `_halves` cuts its last axis
    bias = tuple(jnp.swapaxes(x, 1, 2) for x in bias)
  if zigzag:
    return from_zigzag(_ring(q, k, v, key_padding, documents, bias, 'zigzag', axis, block), axis)
  return _ring(q, k, v, key_padding, documents, bias, causal, axis, block)


def _halves(tree):
  """(first, second) halves of the query side's arrays along their tokens: axis 1, or the
  last axis of a log-sum-exp `[b, h, m]`."""
  cut = lambda x, first: (
    (x[..., : x.shape[-1] // 2] if first else x[..., x.shape[-1] // 2 :])
    if x.ndim == 3
    else (x[:, : x.shape[1] // 2] if first else x[:, x.shape[1] // 2 :])
  )
  return jax.tree.map(lambda x: cut(x, True), tree), jax.tree.map(lambda x: cut(x, False), tree)


def _visit(step, i, s: int, causal, q, kv, empty):
  """`step(q, *kv)` for the block that visits at ring step s >= 1: skipped (`empty(q)`) where
  causal and the block comes from a later device (i < s). Zigzag (`causal == 'zigzag'`):
  `step(q, *first half of kv)` for a block from an earlier device, `step(second half of q,
  *kv)` for one from a later device, `empty` giving the first half's result; q is the
  query side's arrays (a tuple), cut by `_halves`."""
  if not causal:
    return step(q, *kv)
  if causal != 'zigzag':
    return lax.cond(i >= s, step, lambda q, *kv: empty(q), q, *kv)

  def earlier(q, *kv):
    result = step(q, *_halves(kv)[0])
    if len(result) == 2:  # forward: (out, lse) of every query
      return result
    # backward: the keys' gradients (dk, dv, and the key bias's), zeros for their second half
    pad = lambda d, axis: jnp.concatenate([d, jnp.zeros_like(d)], axis)
    padded = (result[0], pad(result[1], 1), pad(result[2], 1))
    return padded if len(result) == 3 else padded + (result[3], pad(result[4], -1))

  def later(q, *kv):
    first, second = _halves(q)
    result, zero = step(second, *kv), empty(first)
    if len(result) == 2:  # forward: (out [b, m/2, h, dv], lse [b, h, m/2]) of the second half
      return jnp.concatenate([zero[0], result[0]], 1), jnp.concatenate([zero[1], result[1]], 2)
    rows = (jnp.concatenate([zero[0], result[0]], 1),) + tuple(result[1:3])
    return (
      rows
      if len(result) == 3
      else rows + (jnp.concatenate([zero[3], result[3]], -1),) + (result[4],)
    )

  return lax.cond(i >= s, earlier, later, q, *kv)


def _given(documents):
  """(documents,) or (): a `RingBlock` without packed rows is called as before them."""
  return () if documents is None else (documents,)


def _meeting(step, skipped):
  """step(q_side, k, v, key_padding, key_documents) where the visiting block's documents
  can meet the queries' (the last of the query side), else skipped(q_side, k, v, ...):
  a packed row's block pairs that share no document cost nothing."""

  def run(queries, *kv):  # the key documents last, as the queries'
    everything = lambda x: masking.document_ranges(x, x.shape[1])
    meets = jnp.any(masking.ranges_meet(everything(queries[-1]), everything(kv[-1])))
    return lax.cond(meets, step, skipped, queries, *kv)

  return run


def _sides(queries, k, v, key_padding, documents, bias):
  """(the query side's arrays, the visiting block's): `queries` then the query bias and
  documents, and k, v, key_padding then the key bias and documents (documents last on
  each, as `_meeting` reads them; each only where given)."""
  first = lambda pair: () if pair is None else (pair[0],)
  second = lambda pair: () if pair is None else (pair[1],)
  return (
    queries + first(bias) + first(documents),
    (k, v, key_padding) + second(bias) + second(documents),
  )


def _block_call(method, rows: int, bias: bool, documents: bool):
  """step(query side, *visiting block) -> method(q, k, v, key_padding, False, *the `rows`
  row arrays after q, [documents], [bias=]) on the arrays `_sides` lays out."""

  def step(queries, *kv):
    q_extra, k_extra = queries[1 + rows :], kv[3:]
    given = ((q_extra[-1], k_extra[-1]),) if documents else ()
    kwargs = {'bias': (q_extra[0], k_extra[0])} if bias else {}
    return method(queries[0], *kv[:3], False, *queries[1 : 1 + rows], *given, **kwargs)

  return step


def _ring_forward(q, k, v, key_padding, documents, bias, causal, axis, block):
  n, i = lax.axis_size(axis), lax.axis_index(axis)
  kwargs = {} if bias is None else {'bias': bias}
  out, lse = block.forward(q, k, v, key_padding, causal, *_given(documents), **kwargs)
  out = out.astype(jnp.promote_types(out.dtype, lse.dtype))  # the merges' dtype

  def empty(queries):
    q = queries[0]
    zero = jnp.zeros(q.shape[:3] + v.shape[3:], out.dtype) * q[..., :1]  # q's placement
    return zero, jnp.swapaxes(zero[..., 0], 1, 2) + masking.big_neg(lse.dtype)

  queries, kv = _sides((q,), k, v, key_padding, documents, bias)
  step = _block_call(block.forward, 0, bias is not None, documents is not None)
  if documents is not None:
    step = _meeting(step, lambda queries, *kv: empty(queries))

  def visit(s, carry):  # a loop, not unrolled: one visiting block's scores live at a time
    kv, out, lse = carry
    kv = rotate(kv, axis)
    o_s, l_s = _visit(step, i, s, causal, queries, kv, empty)
    out, lse = merge_softmax(out, lse, o_s.astype(out.dtype), l_s)
    return kv, out, lse

  _, out, lse = lax.fori_loop(1, n, visit, (kv, out, lse))
  return out, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8))
def _ring(q, k, v, key_padding, documents, bias, causal, axis, block):
  return _ring_forward(q, k, v, key_padding, documents, bias, causal, axis, block)[0]


def _ring_fwd(q, k, v, key_padding, documents, bias, causal, axis, block):
  out, lse = _ring_forward(q, k, v, key_padding, documents, bias, causal, axis, block)
  return out, (q, k, v, key_padding, documents, bias, out, lse)


def _ring_bwd(causal, axis, block, res, g):
  q, k, v, key_padding, documents, bias, out, lse = res
  n, i = lax.axis_size(axis), lax.axis_index(axis)
  lse = jnp.where(lse > masking.big_neg(lse.dtype) / 2, lse, jnp.inf)  # no key: p = 0
  g = g.astype(out.dtype)
  kwargs = {} if bias is None else {'bias': bias}
  grads = block.backward(
    q, k, v, key_padding, causal, out, lse, g, *_given(documents), **kwargs
  )  # (dq, dk, dv[, d query bias, d key bias])

  def empty(queries, k, v, key_padding, *extra):  # no share: zero gradients
    del key_padding
    zeros = (jnp.zeros_like(queries[0]), jnp.zeros_like(k), jnp.zeros_like(v))
    if bias is None:
      return zeros
    return zeros + (jnp.zeros_like(queries[4]), jnp.zeros_like(extra[0]))

  queries, kv = _sides((q, out, lse, g), k, v, key_padding, documents, bias)
  step = _block_call(block.backward, 3, bias is not None, documents is not None)
  if documents is not None:
    step = _meeting(step, empty)
  empty_rows = lambda queries: empty(queries, *kv)

  # A block travels with its keys' gradients: dk, dv (and the key bias's).
  key_grads = grads[1:3] + grads[4:]
  row_grads = grads[:1] + grads[3:4]  # dq (and the query bias's), this device's

  def visit(s, carry):  # a loop, not unrolled: one visiting block at a time
    ring, rows = carry
    ring = rotate(ring, axis)
    kv_s, acc = ring[: len(kv)], ring[len(kv) :]
    got = _visit(step, i, s, causal, queries, kv_s, empty_rows)
    got_rows, got_keys = got[:1] + got[3:4], got[1:3] + got[4:]
    ring = kv_s + tuple(a + b.astype(a.dtype) for a, b in zip(acc, got_keys))
    return ring, tuple(a + b.astype(a.dtype) for a, b in zip(rows, got_rows))

  ring, rows = lax.fori_loop(1, n, visit, (kv + key_grads, row_grads))
  keys = rotate(ring[len(kv) :], axis)  # each block's gradients back to its device
  dbias = None if bias is None else (rows[1], keys[2])
  return rows[0], keys[0], keys[1], None, None, dbias


_ring.defvjp(_ring_fwd, _ring_bwd)
