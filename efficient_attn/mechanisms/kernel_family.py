"""The declaration shared by the kernel mechanisms (linear, RFA, Performer).

Their math is `efficient_attn.ops.linear_attention`: a feature map, then kernel attention
in its bidirectional, causal chunked, recurrent or sequence-parallel form, on packed rows
too (`segment_ids`: the sums restart at each document).
"""

import jax.numpy as jnp

from efficient_attn import registry
from efficient_attn.ops.gated import documents
from efficient_attn.ops.linear_attention import init_kernel_state

CHUNK_SIZE = registry.Option(
  'chunk_size',
  None,
  int,
  'chunk length of the causal scan; None: the platform\'s (64 on CPU, 256 on GPU and TPU)',
  minimum=1,
  allow_none=True,
)


def segment_ids_of(ctx: registry.Context):
  """The segment ids `[batch, length]` of a layer's packed rows (`ctx.documents` + 1; the
  key padding stays in the mask), or None."""
  return None if ctx.documents is None else documents.as_segment_ids(ctx.documents, None)


class KernelMechanism(registry.Mechanism):
  """A kernel mechanism: causal, recurrent decoding of a `KernelState`, rotary on features.

  Subclasses give `feature_dim`, the width f of phi (the state is `[f, v_dim]`
  per head); it defaults to head_dim (feature maps applied elementwise); and
  `token_step(options, params, state, q_t, k_t, v_t, *, ctx, key_valid)`, one decoding
  step that leaves the state alone where `key_valid` `[batch]` is False (`step` adds the
  documents of a packed stream around it).
  """

  causal = True
  decode = 'recurrent'
  rotary = 'features'
  sequence_parallel = 'prefix_state'
  segments = True

  def feature_dim(self, options: registry.Options, head_dim: int) -> int:
    """f, the width of the query and key features."""
    del options
    return head_dim

  def init_state(self, options, *, batch, heads, head_dim, v_dim):
    state = init_kernel_state(batch, heads, self.feature_dim(options, head_dim), v_dim)
    return state._replace(segment=jnp.zeros((batch,), jnp.int32))

  def token_step(self, options, params, state, q_t, k_t, v_t, *, ctx, key_valid):
    """One token's step (see the class docstring)."""
    raise NotImplementedError

  def step(self, options, params, state, q_t, k_t, v_t, *, ctx):
    """One token. `ctx.documents` `[batch, 1]`: the token's segment id (0: padding; None:
    one document): a real token whose id differs from `state.segment` (when that is not 0)
    starts a new document from the empty state; a padding token changes nothing and its
    output is 0."""
    if ctx.documents is None:
      return self.token_step(options, params, state, q_t, k_t, v_t, ctx=ctx, key_valid=None)
    real, reset, segment = documents.token_documents(ctx.documents, state.segment, self.name)
    empty = init_kernel_state(*state.z.shape, state.s.shape[-1], state.s.dtype)
    state = state._replace(
      **{
        name: documents.where_rows(~reset, getattr(state, name), getattr(empty, name))
        for name in ('s', 'z', 'log_scale')
      }
    )
    state, out = self.token_step(options, params, state, q_t, k_t, v_t, ctx=ctx, key_valid=real)
    return state._replace(segment=segment), documents.where_rows(
      real, out, jnp.zeros((), out.dtype)
    )
