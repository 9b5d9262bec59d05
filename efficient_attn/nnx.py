"""The NNX layers, from the same declarations as the Linen ones (`efficient_attn.layers.nnx`,
`nnx_mechanism`, `nnx_params`).

    from flax import nnx
    import efficient_attn.nnx as ean

    layer = ean.MultiHeadAttention(num_heads=4, in_features=64, mechanism='linear',
                                   projection='efficient', rngs=nnx.Rngs(0))
    y = layer(x)                                   # x [..., length, 64]

`MultiHeadAttention` takes the arguments of `flax.nnx.MultiHeadAttention` plus the
mechanism's; `to_linen_params` and `load_linen_params` move weights between the APIs.
"""

from efficient_attn.layers.nnx import MultiHeadAttention
from efficient_attn.layers.nnx_mechanism import Alignment
from efficient_attn.layers.nnx_mechanism import Mechanism
from efficient_attn.layers.nnx_params import load_linen_params
from efficient_attn.layers.nnx_params import to_linen_params

__all__ = ['Alignment', 'Mechanism', 'MultiHeadAttention', 'load_linen_params', 'to_linen_params']
