"""The one place where mechanism and projection names are defined.

Each entry names the Linen module (imported lazily, so importing the package
stays cheap) and the pure function behind it, and says what the mechanism can
do. `get_mechanism('nope')` fails with the list of valid names.
"""
import dataclasses
import importlib
from typing import Any, Callable, Tuple


@dataclasses.dataclass(frozen=True)
class MechanismSpec:
  """What the library knows about one attention mechanism.

  Attributes:
    name: registry name, e.g. 'nystrom'.
    module_path: 'package.module:ClassName' of the Linen module. The module's
      `__call__(q, k, v, mask=None, deterministic=True)` maps
      `[batch, length, heads, head_dim]` arrays to `[batch, q_length, heads, v_dim]`;
      its dataclass fields include `causal`, `max_length`, `dtype`,
      `param_dtype` and the mechanism's own options.
    fn_path: 'package.module:function' of the pure function.
    supports_causal: whether `causal=True` is allowed.
    fixed_length: whether the mechanism needs `max_length` (learned length-n maps).
    parameter_free: whether it is usable as an `attention_fn` of
      `nn.MultiHeadDotProductAttention` (no parameters, no randomness).
    description: one line for listings.
  """
  name: str
  module_path: str
  fn_path: str
  supports_causal: bool
  fixed_length: bool
  parameter_free: bool
  description: str

  @property
  def module(self) -> Any:
    return _load(self.module_path)

  @property
  def fn(self) -> Callable[..., Any]:
    return _load(self.fn_path)


def _load(path: str) -> Any:
  module_name, attr = path.split(':')
  return getattr(importlib.import_module(module_name), attr)


_M = 'efficient_attn.mechanisms.'
MECHANISMS = {
    spec.name: spec for spec in (
        MechanismSpec('softmax', _M + 'softmax:SoftmaxAttention', _M + 'softmax:softmax_attention',
                      True, False, True, 'exact scaled dot-product attention, O(n^2)'),
        MechanismSpec('softmax_chunked', _M + 'softmax:ChunkedSoftmaxAttention',
                      _M + 'softmax:chunked_softmax_attention', True, False, True,
                      'exact attention by online softmax over key chunks, O(n) memory'),
        MechanismSpec('linear', _M + 'linear:LinearAttention', _M + 'linear:linear_attention',
                      True, False, True, 'kernelised linear attention (elu+1 / relu / identity)'),
        MechanismSpec('rfa', _M + 'random_features:RFAAttention', _M + 'random_features:rfa_attention',
                      True, False, False, 'random feature attention, trigonometric features'),
        MechanismSpec('performer', _M + 'random_features:PerformerAttention',
                      _M + 'random_features:performer_attention', True, False, False,
                      'FAVOR+ with positive orthogonal random features'),
        MechanismSpec('linformer', _M + 'linformer:LinformerAttention',
                      _M + 'linformer:linformer_attention', False, True, False,
                      'learned length projections E, F (n -> k)'),
        MechanismSpec('nystrom', _M + 'nystrom:NystromAttention', _M + 'nystrom:nystrom_attention',
                      False, False, False, 'Nystrom landmarks and iterative pseudo-inverse'),
        MechanismSpec('local', _M + 'local:LocalAttention', _M + 'local:local_attention',
                      True, False, True, 'sliding-window attention in blocks, O(n w)'),
    )
}

PROJECTIONS: Tuple[str, ...] = ('standard', 'optimised', 'efficient', 'super')


def list_mechanisms() -> Tuple[str, ...]:
  return tuple(MECHANISMS)


def list_projections() -> Tuple[str, ...]:
  return PROJECTIONS


def get_mechanism(name: str) -> MechanismSpec:
  if name not in MECHANISMS:
    raise ValueError(f'Unknown attention mechanism {name!r}; valid mechanisms: '
                     f'{", ".join(MECHANISMS)}')
  return MECHANISMS[name]


def check_projection(name: str) -> str:
  if name not in PROJECTIONS:
    raise ValueError(f'Unknown projection scheme {name!r}; valid projections: '
                     f'{", ".join(PROJECTIONS)}')
  return name
