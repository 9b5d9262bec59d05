"""Models built from the shared encoder: ViT, text classifier, causal model, and an MLP."""
from efficient_attn.models.causal import CausalTransformer
from efficient_attn.models.mlp import MLP
from efficient_attn.models.text import TextClassifier, TextMatcher
from efficient_attn.models.transformer import Encoder, EncoderBlock, MlpBlock, TransformerConfig
from efficient_attn.models.vit import ViT
