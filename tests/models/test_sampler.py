"""The next-token sampler (`efficient_attn.models.sampling`): temperature, top-k, top-p.

The kept sets of top-k and top-p are checked against a NumPy reference written from their
definitions (a loop over the tokens, most likely first), ties and the corner values
included; temperature against the softmax it samples from.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from efficient_attn.models import sampling


def kept_top_k(logits, k):
  """The tokens of a row that top-k keeps: every token at least as likely as the k-th."""
  if k >= len(logits):
    return set(range(len(logits)))
  kth = sorted(logits, reverse=True)[k - 1]
  return {i for i, x in enumerate(logits) if x >= kth}


def kept_top_p(logits, p):
  """The tokens of a row that top-p keeps: the most likely first, until their probability
  reaches p, and every token as likely as the last one taken."""
  x = np.asarray(logits, np.float64)
  probs = np.exp(x - x.max())
  probs /= probs.sum()
  total, least = 0.0, None
  for i in sorted(range(len(x)), key=lambda i: -x[i]):
    if total >= p:
      break
    total += probs[i]
    least = x[i]
  return {i for i in range(len(x)) if x[i] >= least}


def kept(filtered):
  return [set(np.flatnonzero(np.isfinite(np.asarray(row)))) for row in filtered]


ROWS = np.asarray(
  [
    [2.0, 1.0, 1.0, 0.5, -1.0, -3.0, 0.0, 0.5],  # ties at the cuts
    [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],  # all equal
    [9.0, -9.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6],  # one dominant token
  ],
  np.float32,
)


@pytest.mark.parametrize('k', [1, 2, 3, 5, 8, 20])
def test_top_k_keeps_the_k_most_likely_and_their_ties(k):
  got = kept(sampling.top_k_logits(jnp.asarray(ROWS), k))
  assert got == [kept_top_k(row.tolist(), k) for row in ROWS]


@pytest.mark.parametrize('p', [1e-6, 0.2, 0.5, 0.75, 0.9, 0.999, 1.0])
def test_top_p_keeps_the_nucleus_against_numpy(p):
  rows = np.concatenate([ROWS, np.random.default_rng(0).normal(size=(16, 8)).astype(np.float32)])
  got = kept(sampling.top_p_logits(jnp.asarray(rows), p))
  assert got == [kept_top_p(row.tolist(), p) for row in rows]
  traced = kept(jax.jit(sampling.top_p_logits)(jnp.asarray(rows), p))  # a traced top_p
  assert traced == got


def test_top_p_stops_where_the_probability_reaches_p_exactly():
  # probabilities 1/2, 1/4, 1/8, 1/8, exact in float32: 1/2 + 1/4 reaches 0.75
  logits = jnp.asarray(np.log([[0.5, 0.25, 0.125, 0.125]]), jnp.float32)
  top_p_logits = jax.jit(sampling.top_p_logits, static_argnums=1)  # top_p a Python float
  assert kept(top_p_logits(logits, 0.75)) == [{0, 1}]
  assert kept(top_p_logits(logits, 0.7501)) == [{0, 1, 2, 3}]  # and the tie
  assert kept(top_p_logits(logits, 0.5)) == [{0}]


def test_a_cut_keeps_the_logits_it_keeps():
  cut = jax.jit(sampling.top_p_logits, static_argnums=1)(jnp.asarray(ROWS), 0.5)
  finite = np.isfinite(cut)
  np.testing.assert_array_equal(np.asarray(cut)[finite], ROWS[finite])


def _draws(**options):
  logits = jnp.log(jnp.asarray([[0.5, 0.3, 0.15, 0.05]]))
  keys = jax.random.split(jax.random.key(0), 4000)
  draws = jax.jit(jax.vmap(lambda key: sampling.sample_logits(key, logits, **options)[0]))(keys)
  return np.bincount(np.asarray(draws), minlength=4) / len(keys)


def test_sampling_follows_softmax_of_logits_over_temperature():
  np.testing.assert_allclose(_draws(temperature=1.0), [0.5, 0.3, 0.15, 0.05], atol=0.03)
  sharper = np.asarray([0.5, 0.3, 0.15, 0.05]) ** 2
  np.testing.assert_allclose(_draws(temperature=0.5), sharper / sharper.sum(), atol=0.03)
  np.testing.assert_array_equal(_draws(temperature=0.0), [1, 0, 0, 0])


def test_top_k_and_top_p_sample_only_the_kept_tokens_renormalised():
  np.testing.assert_allclose(_draws(temperature=1.0, top_k=2), [0.625, 0.375, 0, 0], atol=0.03)
  # top-p 0.7: 0.5 then 0.3 reach it; the rest never drawn
  np.testing.assert_allclose(_draws(temperature=1.0, top_p=0.7), [0.625, 0.375, 0, 0], atol=0.03)
  # top-k first, then top-p of what is left (0.5 / 0.95 > 0.5 already)
  np.testing.assert_array_equal(_draws(temperature=1.0, top_k=3, top_p=0.5), [1, 0, 0, 0])


@pytest.mark.parametrize(
  'options, message',
  [
    (dict(top_k=-1), 'top_k=-1 is not valid'),
    (dict(top_k=2.0), 'top_k=2.0 is not valid'),
    (dict(top_p=0.0), 'top_p=0.0 is not valid; it must be in (0, 1]'),
    (dict(top_p=1.5), 'top_p=1.5 is not valid'),
  ],
)
def test_bad_cuts_are_one_line(options, message):
  with pytest.raises(
    ValueError, match=message.replace('(', r'\(').replace(')', r'\)').replace('[', r'\[')
  ) as e:
    sampling.sample_logits(jax.random.key(0), jnp.zeros((1, 4)), 1.0, **options)
  assert '\n' not in str(e.value)
