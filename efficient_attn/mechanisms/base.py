"""The base Linen module every mechanism module derives from."""
from typing import Any, Optional

import flax.linen as nn
import jax.numpy as jnp


class Mechanism(nn.Module):
  """Scores and mixes already-projected heads.

  Subclasses implement `__call__(q, k, v, mask=None, deterministic=True)` with
  q `[batch, q_length, heads, head_dim]`, k `[batch, kv_length, heads, head_dim]`,
  v `[batch, kv_length, heads, v_dim]`, and return `[batch, q_length, heads, v_dim]`.

  Optional recurrent decoding form (used by `MultiHeadAttention(decode=True)`,
  see `efficient_attn.decoding`): a causal mechanism may also define
  `init_state(batch, heads, head_dim, v_dim, dtype=jnp.float32) -> state` (a
  pytree of constant size) and `step(state, q_t, k_t, v_t) -> (state, out_t)`
  with tokens `[batch, 1, heads, dim]`; feeding tokens 0..n-1 must reproduce the
  causal `__call__`. Exact softmax mechanisms decode with a key/value cache instead.

  Attributes:
    causal: query i attends only to keys j <= i.
    max_length: the longest sequence the mechanism is built for (needed by
      mechanisms with length-shaped parameters, e.g. Linformer).
    dtype: computation dtype (None: the inputs' dtype).
    param_dtype: dtype of parameters the mechanism creates.
  """
  causal: bool = False
  max_length: Optional[int] = None
  dtype: Any = None
  param_dtype: Any = jnp.float32
