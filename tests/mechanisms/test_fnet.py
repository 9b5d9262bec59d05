"""Tests of efficient_attn.mechanisms.fnet against NumPy's FFT in float64."""

from helpers import value_and_grads
import jax
import jax.numpy as jnp
import numpy as np
from pattern_reference import flax_mask
from pattern_reference import inputs
from pattern_reference import padding
from pattern_reference import with_noise_at_padding
import pytest

from efficient_attn.mechanisms import fnet

fnet_mixing = jax.jit(fnet.fnet_mixing, static_argnames=('causal',))


def np_fnet(v, key_padding=None):
  """Re(FFT_seq(FFT_hidden(v))) over the flattened heads x v_dim axis, float64."""
  x = np.asarray(v, np.float64)
  if key_padding is not None:
    x = x * np.asarray(key_padding)[:, :, None, None]
  b, n, h, dv = x.shape
  x = x.reshape(b, n, h * dv)
  return np.real(np.fft.fft(np.fft.fft(x, axis=-1), axis=1)).reshape(b, n, h, dv)


def test_matches_numpy_fft(x64):
  """Under jax.jit, without a mask, with key padding and with a flax-style mask."""
  q, k, v = inputs(n=12)
  pad = padding(12)
  for mask, key_padding in ((None, None), (pad, pad), (flax_mask(pad), pad)):
    got = fnet_mixing(q, k, v, mask)
    assert got.dtype == jnp.float64 and got.shape == v.shape
    np.testing.assert_allclose(np.asarray(got), np_fnet(v, key_padding), rtol=1e-10, atol=1e-10)


def test_padded_values_move_no_output():
  """Values at padded positions are zeroed: they move no output, get no gradient."""
  q, k, v = inputs(n=12, dtype=np.float32)
  pad = padding(12)
  vg = value_and_grads(fnet.fnet_mixing)
  out, (gq, gk, gv) = vg(q, k, v, pad)
  out2, _ = vg(q, k, with_noise_at_padding(v, pad), pad)
  np.testing.assert_array_equal(np.asarray(out2), np.asarray(out))
  assert np.all(np.asarray(gv)[~pad] == 0) and np.any(np.asarray(gv)[pad] != 0)
  assert np.all(np.asarray(gq) == 0) and np.all(np.asarray(gk) == 0)  # q, k are unused


def test_real_outputs_depend_on_padded_length(x64):
  """Documented: the DFT is over all n positions, so padding changes real outputs."""
  q, k, v = inputs(b=1, n=8)
  pad = np.array([[True] * 6 + [False] * 2])
  short = fnet_mixing(q[:, :6], k[:, :6], v[:, :6])
  padded = fnet_mixing(q, k, v, pad)
  assert not np.allclose(np.asarray(short), np.asarray(padded)[:, :6])


def test_bfloat16_finite():
  q, k, v = (jnp.asarray(x, jnp.bfloat16) for x in inputs(n=12))
  out, grads = value_and_grads(fnet.fnet_mixing)(q, k, v, padding(12))
  assert out.dtype == jnp.bfloat16
  assert bool(jnp.all(jnp.isfinite(out.astype(jnp.float32))))
  for g in grads:
    assert g.dtype == jnp.bfloat16 and bool(jnp.all(jnp.isfinite(g.astype(jnp.float32))))
  ref = np_fnet(np.asarray(v, np.float32), padding(12))
  np.testing.assert_allclose(np.asarray(out, np.float32), ref, atol=0.15 * np.abs(ref).max())


def test_errors():
  q, k, v = inputs(b=1, n=8, h=1)
  with pytest.raises(ValueError, match='causal'):
    fnet.fnet_mixing(q, k, v, causal=True)
  with pytest.raises(ValueError, match='q_length == kv_length'):
    fnet.fnet_mixing(q[:, :4], k, v)
