"""efficient-attn: efficient attention mechanisms for JAX/Flax.

import efficient_attn as ea
ea.list_mechanisms()     # ('softmax', 'softmax_chunked', 'linear', ...)
ea.list_projections()    # ('standard', 'optimised', 'efficient', 'super')
layer = ea.MultiHeadAttention(num_heads=4, mechanism='linear', projection='efficient')
ea.get_mechanism('nystrom').options   # what a mechanism declares about itself
"""

from efficient_attn import mechanisms
from efficient_attn.layers.attention_fn import make_attention_fn
from efficient_attn.layers.linen import MultiHeadAttention
from efficient_attn.layers.linen_mechanism import Mechanism
from efficient_attn.layers.linen_mechanism import mechanism_module
from efficient_attn.registry import get_mechanism
from efficient_attn.registry import list_mechanisms
from efficient_attn.registry import list_projections

__all__ = [
  'Mechanism',
  'MultiHeadAttention',
  'make_attention_fn',
  'mechanism_module',
  'mechanisms',
  'get_mechanism',
  'list_mechanisms',
  'list_projections',
]
__version__ = '0.2.0'
