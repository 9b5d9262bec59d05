"""Models built from the shared encoder: ViT, text classifier, causal model, and an MLP.

Generation from the causal model is `efficient_attn.models.generate` (also
`CausalTransformer.generate`); its sampler, `efficient_attn.models.sampling`.
"""

from efficient_attn.models.causal import CausalTransformer
from efficient_attn.models.mlp import MLP
from efficient_attn.models.text import TextClassifier
from efficient_attn.models.text import TextMatcher
from efficient_attn.models.transformer import Encoder
from efficient_attn.models.transformer import EncoderBlock
from efficient_attn.models.transformer import MlpBlock
from efficient_attn.models.transformer import TransformerConfig
from efficient_attn.models.vit import ViT

__all__ = [
  'TransformerConfig',
  'Encoder',
  'EncoderBlock',
  'MlpBlock',
  'CausalTransformer',
  'ViT',
  'TextClassifier',
  'TextMatcher',
  'MLP',
]
