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

  forward(q, k, v, key_padding, causal[, documents]) -> (out `[b, m, h, dv]`, lse `[b, h,
    m]`): softmax attention of the (scaled) queries over this block of keys, and each
    row's log-sum-exp (`masking.big_neg` for a row with no key, output 0); causal: the
    diagonal block (key j <= query i); documents, passed only for a packed row: the
    `masking.document_pair` of the queries and this block's keys (a query sees its own
    document's keys). Not differentiated.
  backward(q, k, v, key_padding, causal, out, lse, g[, documents]) -> (dq, dk, dv): this
    block's share of the gradients of the whole attention, whose output is `out` and
    log-sum-exp `lse` (+inf for a row with no key), for the output cotangent g.
  """

  forward: Callable[..., Any]
  backward: Callable[..., Any]


def ring_attention(
  q, k, v, key_padding, *, causal: bool, axis: str, block: RingBlock, documents=None
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
  """
  if key_padding is None:
    key_padding = jnp.ones(k.shape[:2], bool)
  if documents is not None:
    documents = masking.document_pair(documents, key_padding, key_padding)
  if causal and lax.axis_size(axis) > 1 and q.shape[1] % 2 == 0:
    q, k, v, key_padding, documents = to_zigzag((q, k, v, key_padding, documents), axis)
    return from_zigzag(_ring(q, k, v, key_padding, documents, 'zigzag', axis, block), axis)
  return _ring(q, k, v, key_padding, documents, causal, axis, block)


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
    dq, dk, dv = result  # backward: the keys' gradients, zeros for their second half
    pad = lambda d: jnp.concatenate([d, jnp.zeros_like(d)], 1)
    return dq, pad(dk), pad(dv)

  def later(q, *kv):
    first, second = _halves(q)
    result, zero = step(second, *kv), empty(first)
    if len(result) == 2:  # forward: (out [b, m/2, h, dv], lse [b, h, m/2]) of the second half
      return jnp.concatenate([zero[0], result[0]], 1), jnp.concatenate([zero[1], result[1]], 2)
    return (jnp.concatenate([zero[0], result[0]], 1),) + tuple(result[1:])

  return lax.cond(i >= s, earlier, later, q, *kv)


def _given(documents):
  """(documents,) or (): a `RingBlock` without packed rows is called as before them."""
  return () if documents is None else (documents,)


def _meeting(step, skipped):
  """step(q_side, k, v, key_padding, key_documents) where the visiting block's documents
  can meet the queries' (the last of the query side), else skipped(q_side, k, v, ...):
  a packed row's block pairs that share no document cost nothing."""

  def run(queries, k, v, kp, documents):
    everything = lambda x: masking.document_ranges(x, x.shape[1])
    meets = jnp.any(masking.ranges_meet(everything(queries[-1]), everything(documents)))
    return lax.cond(meets, step, skipped, queries, k, v, kp, documents)

  return run


def _ring_forward(q, k, v, key_padding, documents, causal, axis, block):
  n, i = lax.axis_size(axis), lax.axis_index(axis)
  out, lse = block.forward(q, k, v, key_padding, causal, *_given(documents))
  out = out.astype(jnp.promote_types(out.dtype, lse.dtype))  # the merges' dtype

  def empty(queries):
    q = queries[0]
    zero = jnp.zeros(q.shape[:3] + v.shape[3:], out.dtype) * q[..., :1]  # q's placement
    return zero, jnp.swapaxes(zero[..., 0], 1, 2) + masking.big_neg(lse.dtype)

  if documents is None:
    queries, kv = (q,), (k, v, key_padding)
    step = lambda queries, k, v, kp: block.forward(queries[0], k, v, kp, False)
  else:
    queries, kv = (q, documents[0]), (k, v, key_padding, documents[1])
    step = _meeting(
      lambda queries, k, v, kp, dk: block.forward(queries[0], k, v, kp, False, (queries[1], dk)),
      lambda queries, *kv: empty(queries),
    )

  def visit(s, carry):  # a loop, not unrolled: one visiting block's scores live at a time
    kv, out, lse = carry
    kv = rotate(kv, axis)
    o_s, l_s = _visit(step, i, s, causal, queries, kv, empty)
    out, lse = merge_softmax(out, lse, o_s.astype(out.dtype), l_s)
    return kv, out, lse

  _, out, lse = lax.fori_loop(1, n, visit, (kv, out, lse))
  return out, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _ring(q, k, v, key_padding, documents, causal, axis, block):
  return _ring_forward(q, k, v, key_padding, documents, causal, axis, block)[0]


def _ring_fwd(q, k, v, key_padding, documents, causal, axis, block):
  out, lse = _ring_forward(q, k, v, key_padding, documents, causal, axis, block)
  return out, (q, k, v, key_padding, documents, out, lse)


def _ring_bwd(causal, axis, block, res, g):
  q, k, v, key_padding, documents, out, lse = res
  n, i = lax.axis_size(axis), lax.axis_index(axis)
  lse = jnp.where(lse > masking.big_neg(lse.dtype) / 2, lse, jnp.inf)  # no key: p = 0
  g = g.astype(out.dtype)
  dq, dk, dv = block.backward(q, k, v, key_padding, causal, out, lse, g, *_given(documents))

  def empty(queries):
    return jnp.zeros_like(queries[0]), jnp.zeros_like(k), jnp.zeros_like(v)

  queries = (q, out, lse, g)  # the rows' side of the backward
  if documents is None:
    kv = (k, v, key_padding)
    step = lambda queries, k, v, kp: block.backward(queries[0], k, v, kp, False, *queries[1:])
  else:
    queries, kv = queries + (documents[0],), (k, v, key_padding, documents[1])
    step = _meeting(
      lambda queries, k, v, kp, dk: block.backward(
        queries[0], k, v, kp, False, *queries[1:4], (queries[4], dk)
      ),
      lambda queries, k, v, *_: (jnp.zeros_like(queries[0]), jnp.zeros_like(k), jnp.zeros_like(v)),
    )

  def visit(s, carry):  # a loop, not unrolled: one visiting block at a time
    ring, dq = carry
    ring = rotate(ring, axis)
    kv_s, (dk_s, dv_s) = ring[:-2], ring[-2:]
    dq_s, dk_b, dv_b = _visit(step, i, s, causal, queries, kv_s, empty)
    ring = kv_s + (dk_s + dk_b.astype(dk_s.dtype), dv_s + dv_b.astype(dv_s.dtype))
    return ring, dq + dq_s.astype(dq.dtype)

  ring = kv + (dk, dv)  # a block travels with its gradients
  ring, dq = lax.fori_loop(1, n, visit, (ring, dq))
  dk, dv = rotate(ring[-2:], axis)  # each block's gradients back to its device
  return dq, dk, dv, None, None


_ring.defvjp(_ring_fwd, _ring_bwd)
