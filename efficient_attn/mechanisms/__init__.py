"""Attention mechanisms: a registered declaration and a pure function for each.

One file per mechanism (RFA's and Performer's functions in `rfa.py` and `performer.py`,
their declarations together in `random_features.py`); a family's shared declaration in
`gated_family.py` or `kernel_family.py`, and the references' initialisers in
`initializers.py`.

Importing this package imports every mechanism module, and each registers its
declaration with `efficient_attn.registry` (softmax first, then by module name: the
order of `list_mechanisms()`). The pure functions are re-exported here by name, the
decoding steps of the recurrent ones too:

    from efficient_attn import mechanisms
    out = mechanisms.nystrom_attention(q, k, v, num_landmarks=16)
    out = mechanisms.gla_attention(q, k, v, log_decay)     # a gated recurrence alone
    state, out_t = mechanisms.linear_attention_step(state, q_t, k_t, v_t)
    mechanisms.pure_function('gated_deltanet')              # gated_deltanet_attention

Each registered family has one: `<family>_attention`, or the name in `FUNCTIONS`.
"""

from efficient_attn import registry
from efficient_attn.mechanisms import bigbird
from efficient_attn.mechanisms import deltanet
from efficient_attn.mechanisms import fnet
from efficient_attn.mechanisms import forgetting
from efficient_attn.mechanisms import gated_deltanet
from efficient_attn.mechanisms import gated_deltaproduct
from efficient_attn.mechanisms import gla
from efficient_attn.mechanisms import gmlp
from efficient_attn.mechanisms import kda
from efficient_attn.mechanisms import linear
from efficient_attn.mechanisms import linformer
from efficient_attn.mechanisms import local
from efficient_attn.mechanisms import longformer
from efficient_attn.mechanisms import mamba2
from efficient_attn.mechanisms import mixer
from efficient_attn.mechanisms import moba
from efficient_attn.mechanisms import nsa
from efficient_attn.mechanisms import nystrom
from efficient_attn.mechanisms import random_features
from efficient_attn.mechanisms import reformer
from efficient_attn.mechanisms import retention
from efficient_attn.mechanisms import rwkv7
from efficient_attn.mechanisms import sinkhorn
from efficient_attn.mechanisms import softmax
from efficient_attn.mechanisms import sparse
from efficient_attn.mechanisms import synthesizer
from efficient_attn.mechanisms.bigbird import bigbird_attention
from efficient_attn.mechanisms.deltanet import delta_rule_attention
from efficient_attn.mechanisms.deltanet import deltanet_attention
from efficient_attn.mechanisms.fnet import fnet_mixing
from efficient_attn.mechanisms.forgetting import forgetting_attention
from efficient_attn.mechanisms.gated_deltanet import gated_deltanet_attention
from efficient_attn.mechanisms.gated_deltaproduct import gated_deltaproduct_attention
from efficient_attn.mechanisms.gla import gla_attention
from efficient_attn.mechanisms.gmlp import spatial_gating
from efficient_attn.mechanisms.kda import kda_attention
from efficient_attn.mechanisms.linear import linear_attention
from efficient_attn.mechanisms.linear import linear_attention_step
from efficient_attn.mechanisms.linformer import linformer_attention
from efficient_attn.mechanisms.local import local_attention
from efficient_attn.mechanisms.longformer import longformer_attention
from efficient_attn.mechanisms.mamba2 import mamba2_attention
from efficient_attn.mechanisms.mixer import token_mixing
from efficient_attn.mechanisms.moba import moba_attention
from efficient_attn.mechanisms.nsa import nsa_attention
from efficient_attn.mechanisms.nystrom import nystrom_attention
from efficient_attn.mechanisms.performer import performer_attention
from efficient_attn.mechanisms.performer import performer_attention_step
from efficient_attn.mechanisms.reformer import reformer_attention
from efficient_attn.mechanisms.retention import retention_attention
from efficient_attn.mechanisms.rfa import rfa_attention
from efficient_attn.mechanisms.rfa import rfa_attention_step
from efficient_attn.mechanisms.rwkv7 import rwkv7_attention
from efficient_attn.mechanisms.sinkhorn import sinkhorn_attention
from efficient_attn.mechanisms.softmax import chunked_softmax_attention
from efficient_attn.mechanisms.softmax import softmax_attention
from efficient_attn.mechanisms.sparse import sparse_attention
from efficient_attn.mechanisms.synthesizer import synthesizer_attention

#: The pure function of each mechanism family not named `<family>_attention`.
FUNCTIONS = {
  'softmax_chunked': 'chunked_softmax_attention',
  'fnet': 'fnet_mixing',
  'gmlp': 'spatial_gating',
  'mixer': 'token_mixing',
}


def pure_function(mechanism: str):
  """The pure function of the registered mechanism family `mechanism` (e.g. 'gla' ->
  `gla_attention`); ValueError naming the valid choices."""
  if mechanism not in registry.list_mechanisms():
    raise ValueError(
      f'mechanism {mechanism!r} is not registered; valid choices: '
      f'{", ".join(registry.list_mechanisms())}'
    )
  return globals()[FUNCTIONS.get(mechanism, f'{mechanism}_attention')]


__all__ = [
  'FUNCTIONS',
  'pure_function',
  'bigbird_attention',
  'chunked_softmax_attention',
  'delta_rule_attention',
  'deltanet_attention',
  'fnet_mixing',
  'forgetting_attention',
  'gated_deltanet_attention',
  'gated_deltaproduct_attention',
  'gla_attention',
  'kda_attention',
  'linear_attention',
  'linear_attention_step',
  'linformer_attention',
  'local_attention',
  'longformer_attention',
  'mamba2_attention',
  'moba_attention',
  'nsa_attention',
  'nystrom_attention',
  'performer_attention',
  'performer_attention_step',
  'reformer_attention',
  'retention_attention',
  'rfa_attention',
  'rfa_attention_step',
  'rwkv7_attention',
  'sinkhorn_attention',
  'softmax_attention',
  'sparse_attention',
  'spatial_gating',
  'synthesizer_attention',
  'token_mixing',
]
