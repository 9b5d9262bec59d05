"""Models built from the shared encoder: ViT, text classifier, causal model, and an MLP."""

from efficient_attn.models.causal import CausalTransformer
from efficient_attn.models.mlp import MLP
from efficient_attn.models.text import TextClassifier
from efficient_attn.models.text import TextMatcher
from efficient_attn.models.transformer import Encoder
from efficient_attn.models.transformer import EncoderBlock
from efficient_attn.models.transformer import MlpBlock
from efficient_attn.models.transformer import TransformerConfig
from efficient_attn.models.vit import ViT
