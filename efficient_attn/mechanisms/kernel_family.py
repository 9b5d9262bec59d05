"""The declaration shared by the kernel mechanisms (linear, RFA, Performer).

Their math is `efficient_attn.ops.linear_attention`: a feature map, then kernel attention
in its bidirectional, causal chunked, recurrent or sequence-parallel form.
"""

from efficient_attn import registry
from efficient_attn.ops.linear_attention import init_kernel_state

CHUNK_SIZE = registry.Option(
  'chunk_size',
  None,
  int,
  'chunk length of the causal scan; None: the platform\'s (64 on CPU, 256 on GPU and TPU)',
  minimum=1,
  allow_none=True,
)


class KernelMechanism(registry.Mechanism):
  """A kernel mechanism: causal, recurrent decoding of a `KernelState`, rotary on features.

  Subclasses give `feature_dim`, the width f of phi (the state is `[f, v_dim]`
  per head); it defaults to head_dim (feature maps applied elementwise).
  """

  causal = True
  decode = 'recurrent'
  rotary = 'features'
  sequence_parallel = 'prefix_state'

  def feature_dim(self, options: registry.Options, head_dim: int) -> int:
    """f, the width of the query and key features."""
    del options
    return head_dim

  def init_state(self, options, *, batch, heads, head_dim, v_dim):
    return init_kernel_state(batch, heads, self.feature_dim(options, head_dim), v_dim)
