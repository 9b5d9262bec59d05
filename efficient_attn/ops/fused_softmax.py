"""Exact attention on the accelerators' fused kernels, and the rule that picks one.

`softmax` attention runs on one of three implementations:

  'xla'    the library's own einsum (`softmax.softmax_attention`): any platform,
           dtype, mask, dropout; it forms the n x n weights.
  'cudnn'  cuDNN flash attention through `jax.nn.dot_product_attention` (GPU,
           float16 / bfloat16, head_dim a multiple of 8 and at most 128).
  'pallas' Pallas kernels: splash attention (`jax.experimental.pallas.ops.tpu`)
           on TPU, lengths a multiple of 128, self-attention; on GPU the
           Triton flash attention kernel shipped with JAX
           (`jax.experimental.pallas.ops.gpu.attention.mha`, forward and
           backward), self-attention, no mask, lengths a multiple of
           `GPU_MIN_BLOCK`, head dim 16-256, float32, bfloat16 or float16.

`choose` returns the implementation for a call, or with `requested='auto'` the
fastest one that can honour it exactly (`AUTO`, per platform, in order): the
einsum whenever attention dropout is on or the weights are asked for (the fused
kernels never form them), and for masks or shapes a kernel cannot take. An
explicit request the call cannot honour raises a one-line error that names the
reason. Every implementation returns 0 for a query that sees no key (a fully
masked row, or under causal masking a query whose earlier keys are all padded),
as the einsum does.

Precision: the GPU kernel's float32 dots take jax's default matmul precision at
trace time, as the einsum's do (`jax.default_matmul_precision('highest')` makes
both full float32; by default NVIDIA GPUs run either in TF32). On an H100
(`benchmarks/gpu_suite.sh`, docs/results/gpu.md) the kernel's error against
float64 equals the einsum's at both precisions (7.5e-4 vs 8.5e-4 at the
default, 1.7e-6 vs 2.0e-6 at 'highest', 2K tokens), and with `GPU_BLOCKS` it
ran faster than the dense einsum in float32 (forward + backward, batch 4, 8
heads of 64: 0.65 vs 0.77 ms at 1K, 6.8 vs 8.7 ms at 4K; causal 3.9 vs 9.2 ms;
batch 1 at 4K: 1.76 vs 2.02 ms), so 'auto' on a GPU takes it after cuDNN.

q `[batch, q_length, heads, head_dim]`, k `[batch, kv_length, heads,
head_dim]`, v `[batch, kv_length, heads, head_dim]`; masks follow
`efficient_attn.ops.masking` (True = attend).
"""

import math
from typing import Literal, Optional, Sequence
import warnings

import jax
import jax.numpy as jnp

from efficient_attn.ops import masking

IMPLEMENTATIONS = ('auto', 'xla', 'cudnn', 'pallas')
AUTO = {'gpu': ('cudnn', 'pallas'), 'tpu': ('pallas',)}  # 'auto' tries these in order
RUNS_ON = {'cudnn': ('gpu',), 'pallas': ('tpu', 'gpu')}
PALLAS_BLOCK = 128  # splash attention's default block: lengths must be multiples of it
GPU_MIN_BLOCK = 16  # the GPU kernel's smallest block (Triton's smallest dot tile)
# The GPU kernel's blocks (block_q, block_k, block_q_dkv, block_kv_dkv, block_q_dq,
# block_kv_dq): on an H100, float32, 4K tokens, batch 4, 8 heads of 64, forward +
# backward took 6.8 ms with these and 10.0 ms with JAX's defaults (128, 128, 32, 32,
# 32, 32), the fastest of five tried (benchmarks.flash_precision --pallas_blocks).
GPU_BLOCKS = (128, 64, 64, 64, 64, 64)
_HALF = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def platform() -> str:
  """The default backend: 'cpu', 'gpu' or 'tpu'."""
  return jax.default_backend()


def _key_mask(mask, batch: int, kv_length: int):
  """The mask as `[batch, kv_length]` if it only masks keys (None if it is None).

  Raises ValueError if it varies over heads or queries (a kernel then cannot take it).
  """
  if (
    mask is not None
    and jnp.ndim(mask) != 2
    and (jnp.ndim(mask) != 4 or mask.shape[1] != 1 or mask.shape[2] != 1)
  ):
    raise ValueError(f'a mask of shape {tuple(jnp.shape(mask))} varies over heads or queries')
  return masking.key_padding_from_mask(mask, batch, kv_length)


def why_not(
  impl: str, q, k, v, mask, causal: bool, on: str, segments: bool = False
) -> Optional[str]:
  """Why `impl` cannot compute this call exactly on platform `on`, or None if it can;
  segments: the call packs documents (`documents`, self-attention)."""
  if impl == 'xla':
    return None
  if on not in RUNS_ON[impl]:
    return f'it runs on {" or ".join(RUNS_ON[impl])}, and this backend is {on!r}'
  if not q.dtype == k.dtype == v.dtype:
    return f'q, k, v dtypes differ ({q.dtype}, {k.dtype}, {v.dtype})'
  lq, lk, d = q.shape[1], k.shape[1], q.shape[-1]
  if v.shape[-1] != d:
    return f'the value dim {v.shape[-1]} differs from the head dim {d}'
  if causal and lq != lk:
    return f'causal attention with q_length {lq} != kv_length {lk}'
  if segments and lq != lk:
    return f'packed documents with q_length {lq} != kv_length {lk}'
  try:
    _key_mask(mask, q.shape[0], lk)
  except ValueError as e:
    return str(e)
  if impl == 'cudnn':
    if jnp.dtype(q.dtype) not in _HALF:
      return f'cuDNN takes float16 or bfloat16, not {q.dtype}'
    if d % 8 or d > 128:
      return f'cuDNN takes a head dim that is a multiple of 8 and <= 128, not {d}'
    if (mask is not None or segments) and (lq % 2 or lk % 2):
      return f'cuDNN with a mask takes even lengths, not {lq} and {lk}'
  elif on == 'gpu':
    return _why_not_gpu_kernel(q.dtype, None if segments else mask, lq, lk, d)
  else:
    if lq != lk:
      return f'splash attention is self-attention; q_length {lq} != kv_length {lk}'
    if lq % PALLAS_BLOCK:
      return f'splash attention takes lengths that are multiples of {PALLAS_BLOCK}, not {lq}'
  return None


def _why_not_gpu_kernel(dtype, mask, lq: int, lk: int, d: int) -> Optional[str]:
  """Why the Pallas GPU kernel cannot take this call (None if it can)."""
  if jnp.dtype(dtype) not in _HALF + (jnp.dtype(jnp.float32),):
    return f'the GPU kernel takes float32, bfloat16 or float16, not {dtype}'
  if mask is not None:
    # Its segment ids are one array for queries and keys alike, so a padded key's
    # query would see the padded keys only, where the einsum lets it see the rest.
    # (With packed documents a padded query's output is 0 in every form, so there
    # the padding is a segment of its own: `pallas_gpu_attention`.)
    return (
      'the GPU kernel takes no mask (its segment ids mask queries and keys alike, '
      'so key padding cannot be expressed exactly)'
    )
  if lq != lk:
    return f'the GPU kernel is self-attention; q_length {lq} != kv_length {lk}'
  if lq % GPU_MIN_BLOCK:
    return f'the GPU kernel takes lengths that are multiples of {GPU_MIN_BLOCK}, not {lq}'
  if not 16 <= d <= 256:
    return f'the GPU kernel takes a head dim from 16 to 256, not {d}'
  return None


def choose(
  requested: str,
  q,
  k,
  v,
  mask=None,
  causal: bool = False,
  *,
  dropout: bool = False,
  weights: bool = False,
  on: Optional[str] = None,
  segments: bool = False,
) -> str:
  """The implementation ('xla', 'cudnn' or 'pallas') that runs this call.

  Args:
    requested: one of `IMPLEMENTATIONS`; 'auto' picks the fused kernel of the
      platform when it can honour the call, else 'xla'.
    q, k, v, mask, causal: the call (see module docstring).
    dropout: attention-weight dropout is on (only 'xla' applies it).
    weights: the call forms the attention weights themselves (identity values,
      `layer.attention_weights`): always 'xla', whatever was requested, since
      the fused kernels never form them.
    on: the platform; default `platform()` (tests pass it to fake one).
    segments: the call packs documents (a `masking.document_pair`, self-attention):
      cuDNN takes them as its dense mask, splash as its `SegmentIds`, the GPU kernel
      as its segment ids (padding a segment of its own, whose outputs are zeroed).
  """
  if requested not in IMPLEMENTATIONS:
    raise ValueError(f'implementation={requested!r}; valid: {", ".join(IMPLEMENTATIONS)}')
  on = on or platform()
  if weights or requested == 'xla':
    return 'xla'
  if requested == 'auto':
    if dropout:
      return 'xla'
    return next(
      (
        kernel
        for kernel in AUTO.get(on, ())
        if not why_not(kernel, q, k, v, mask, causal, on, segments)
      ),
      'xla',
    )
  if dropout:
    raise ValueError(
      f'implementation={requested!r} cannot apply attention dropout; use \'xla\' or \'auto\''
    )
  reason = why_not(requested, q, k, v, mask, causal, on, segments)
  if reason:
    raise ValueError(f'implementation={requested!r} cannot run this call: {reason}')
  return requested


def _zero_blind_rows(out, keys, causal: bool):
  """out `[b, q, h, d]` with 0 for the queries that see no key, as the einsum gives.

  keys `[b, kv]` is the key mask. Without causality a query is blind when its batch
  row masks every key; with it (q_length == kv_length), query i is blind when keys
  0..i are all masked, e.g. under left padding.
  """
  if keys is None:
    return out
  seen = jnp.cumsum(keys, axis=-1) > 0 if causal else keys.any(-1, keepdims=True)
  return jnp.where(seen[:, :, None, None], out, jnp.zeros((), out.dtype))


def _zero_padded_queries(out, documents):
  """out `[b, q, h, d]` with 0 for the padded queries of a packed call (`documents` a
  `masking.document_pair`; unchanged if None): every form gives them 0."""
  if documents is None:
    return out
  real = documents[0] >= 0
  return jnp.where(real[:, :, None, None], out, jnp.zeros((), out.dtype))


def cudnn_attention(
  q,
  k,
  v,
  mask=None,
  causal: bool = False,
  scale: float = 1.0,
  implementation: Literal['xla', 'cudnn'] = 'cudnn',
  documents=None,
):
  """`jax.nn.dot_product_attention` with the library's mask rules.

  A key mask becomes a `[batch, 1, q_length, kv_length]` mask (cuDNN's bias
  must span both lengths), and so do packed documents (`documents`, a
  `masking.document_pair`: one document, both tokens real); `implementation='xla'`
  runs the same call through XLA, which is how the translation is tested off a GPU.
  """
  b, lq, lk = q.shape[0], q.shape[1], k.shape[1]
  keys = _key_mask(mask, b, lk)
  full = None if keys is None else jnp.broadcast_to(keys[:, None, None, :], (b, 1, lq, lk))
  if documents is not None:
    same = masking.same_document(documents)
    full = same if full is None else full & same
  out = jax.nn.dot_product_attention(
    q, k, v, mask=full, scale=scale, is_causal=causal, implementation=implementation
  )
  return _zero_padded_queries(_zero_blind_rows(out, keys, causal), documents)


def pallas_attention(
  q,
  k,
  v,
  mask=None,
  causal: bool = False,
  scale: float = 1.0,
  interpret: bool = False,
  documents=None,
):
  """Splash attention (Pallas, TPU); `interpret=True` runs it on any platform.

  A key mask becomes splash segment ids (queries segment 1, masked keys 0); packed
  documents (`documents`, a `masking.document_pair`) are the segment ids themselves
  (a padded query's is -1 and a padded key's -2, so they meet nothing), and splash skips
  the blocks they do not share.
  """
  from jax.experimental.pallas.ops.tpu import splash_attention as splash  # pylint: disable=g-import-not-at-top

  b, n, h, _ = q.shape
  keys = _key_mask(mask, b, n)
  one = (splash.CausalMask if causal else splash.FullMask)((n, n))
  kernel = splash.make_splash_mha(
    splash.MultiHeadMask([one] * h), head_shards=1, q_seq_shards=1, interpret=interpret
  )
  heads_first = lambda x: jnp.swapaxes(x, 1, 2)
  qs = heads_first(q * jnp.asarray(scale, q.dtype))
  if documents is not None:
    query, key = documents
    if keys is not None:
      key = jnp.where(keys, key, masking.NO_KEY)
    segments = splash.SegmentIds(q=query, kv=key)
  elif keys is not None:
    segments = splash.SegmentIds(q=jnp.ones((b, n), jnp.int32), kv=keys.astype(jnp.int32))
  else:
    segments = None
  out = jax.vmap(lambda a, c, e, s: kernel(a, c, e, segment_ids=s))(
    qs, heads_first(k), heads_first(v), segments
  )
  return _zero_padded_queries(_zero_blind_rows(heads_first(out), keys, causal), documents)


def _gpu_kernel():
  """JAX's `pallas.ops.gpu.attention` module.

  Its `mha` keywords and `BlockSizes` fields are the same in jax 0.10.2 and
  0.11; 0.11 warns on import that the module is deprecated (in favour of
  tokamax), which is not the caller's to act on, so the warning is silenced.
  """
  with warnings.catch_warnings():
    warnings.simplefilter('ignore', DeprecationWarning)
    from jax.experimental.pallas.ops.gpu import attention  # pylint: disable=g-import-not-at-top
  return attention


def gpu_block_sizes(length: int, blocks: Optional[Sequence[int]] = None):
  """The GPU kernel's `BlockSizes` for `length`, each block cut to a power of two dividing it.

  blocks: (block_q, block_k, block_q_dkv, block_kv_dkv, block_q_dq, block_kv_dq),
    powers of two; default `GPU_BLOCKS`.
  """
  gpu = _gpu_kernel()
  return gpu.BlockSizes(*(math.gcd(block, length) for block in (blocks or GPU_BLOCKS)))


def pallas_gpu_attention(
  q,
  k,
  v,
  mask=None,
  causal: bool = False,
  scale: float = 1.0,
  interpret: bool = False,
  block_sizes=None,
  documents=None,
):
  """FlashAttention-2 in Triton through Pallas (JAX's `pallas.ops.gpu.attention.mha`).

  Forward and backward are the kernel's own (a `jax.custom_vjp`); `interpret=True`
  runs it on any platform. Raises ValueError (one line, as `why_not`) for a call
  the kernel cannot take: a mask (without documents), unequal lengths, a length not a
  multiple of `GPU_MIN_BLOCK`, a head dim outside 16-256. No query is blind without a
  mask, so no row needs zeroing. `block_sizes`: a `BlockSizes` of the kernel (default
  `gpu_block_sizes(length)`).

  documents: a `masking.document_pair` (packed rows; the mask, if any, their key
  padding): the kernel's one array of segment ids, for queries and keys alike, is the
  query side (a padded token's -1), so a real query sees its own document's real keys
  and a padded one only padding, whose output is then zeroed (`_zero_padded_queries`).
  """
  reason = why_not('pallas', q, k, v, mask, causal, 'gpu', documents is not None)
  if reason:
    raise ValueError(f"implementation='pallas' cannot run this call: {reason}")
  if documents is not None:
    keys = _key_mask(mask, q.shape[0], k.shape[1])
    ids = documents[0] if keys is None else jnp.where(keys, documents[0], masking.NO_QUERY)
  else:
    ids = None
  out = _gpu_kernel().mha(
    q,
    k,
    v,
    segment_ids=ids,
    sm_scale=float(scale),
    causal=bool(causal),
    block_sizes=block_sizes or gpu_block_sizes(q.shape[1]),
    interpret=interpret,
  )
  return _zero_padded_queries(out, documents)


def attention(
  impl: str, q, k, v, mask=None, causal: bool = False, scale: float = 1.0, documents=None
):
  """Runs the fused implementation `impl` ('cudnn' or 'pallas') chosen by `choose`;
  documents: a `masking.document_pair` (packed rows) or None (the kernels are then called
  as before packing, with positional arguments only)."""
  packed = {} if documents is None else {'documents': documents}
  if impl == 'cudnn':
    return cudnn_attention(q, k, v, mask, causal, scale, **packed)
  if impl == 'pallas':
    kernel = pallas_gpu_attention if platform() == 'gpu' else pallas_attention
    return kernel(q, k, v, mask, causal, scale, **packed)
  raise ValueError(f'no fused implementation {impl!r}; valid: cudnn, pallas')


__all__ = [
  'IMPLEMENTATIONS',
  'choose',
  'why_not',
  'attention',
  'cudnn_attention',
  'pallas_attention',
  'pallas_gpu_attention',
  'gpu_block_sizes',
  'platform',
]
