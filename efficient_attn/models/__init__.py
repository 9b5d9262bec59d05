"""Models built from the shared encoder: ViT, text classifier, causal model."""
from efficient_attn.models.causal import CausalTransformer
from efficient_attn.models.text import TextClassifier
from efficient_attn.models.transformer import Encoder, EncoderBlock, MlpBlock
from efficient_attn.models.vit import ViT
