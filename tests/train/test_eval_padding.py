"""Evaluation batches padded to the mesh: any `eval_batch_size` runs, and the padding rows
(mask 0) count for nothing in any metric. On one device here; on 8 (data 2 x fsdp 2 x
sequence 2) in `test_mesh.py`'s subprocess."""

import jax
import main_runner
import numpy as np
import pytest

from train import api


@pytest.fixture(scope='module')
def built():
  """The tiny digits ViT and parameters (on the host) far enough from their initial values
  that its predictions differ per example (the initial ones are near uniform)."""
  run = api.build(main_runner.config())
  rng = np.random.default_rng(0)
  params = jax.tree.map(
    lambda p: p + rng.normal(scale=0.5, size=p.shape).astype(p.dtype),
    jax.device_get(run.state.params),
  )
  return run, params


def evaluate(built, eval_batch_size):
  run, params = built
  config = main_runner.config()
  config.dataset.eval_batch_size = eval_batch_size
  return api.build(config).evaluate(params)


def test_an_uneven_last_batch_changes_no_metric(built):
  """360 test examples: one batch of 360; 4 of 100 (the last 60 + 40 padding); 52 of 7
  (the last 3 + 4 padding). The accuracy is a count over the same count, so it is equal
  exactly; the loss is the same float32 sum in another order."""
  whole = evaluate(built, 360)
  for size in (100, 7):
    padded = evaluate(built, size)
    assert padded.keys() == whole.keys()
    assert padded['accuracy'] == whole['accuracy'], size
    np.testing.assert_allclose(padded['loss'], whole['loss'], rtol=1e-6)


def test_what_a_padding_row_holds_changes_no_sum_of_the_eval_step(built):
  """The same batch with random padding rows in place of zeros: the eval step's sums are
  equal bit for bit (a padding row that counted would move 'count' and the loss)."""
  run, params = built
  config = main_runner.config()
  config.dataset.eval_batch_size = 100
  import data  # pylint: disable=g-import-not-at-top

  last = list(data.get_eval_data(config).batches())[-1]
  assert last['mask'].sum() == 60 and len(last['mask']) == 100
  noisy = dict(last)
  noise = np.random.default_rng(0).normal(size=last['inputs'][60:].shape) * 3
  noisy['inputs'] = np.concatenate([last['inputs'][:60], noise.astype(np.float32)])
  noisy['label'] = np.concatenate([last['label'][:60], (last['label'][60:] + 3) % 10])
  step = run.eval_step
  zeros = jax.device_get(step(params, run.to_devices(last)))
  other = jax.device_get(step(params, run.to_devices(noisy)))
  assert zeros['count'] == 60
  for key in zeros:
    np.testing.assert_array_equal(other[key], zeros[key], err_msg=key)
