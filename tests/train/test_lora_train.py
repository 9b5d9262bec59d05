"""LoRA through the trainer: frozen base, init_from, transformed data, the rank sweep."""

import json
import os

from flax import traverse_util
import jax
import numpy as np
import pytest

from benchmarks import lora_table
from configs import lora_base
from configs import lora_finetune
from configs import lora_scratch
import data
from data import transforms
from efficient_attn.layers import lora
from train import checkpoint
from train import inference
from train import modeling
from train import sweep
from train import trainer

PNG = b'\x89PNG\r\n\x1a\n'


def short(config, steps):
  config.train.update(dict(num_steps=steps, num_epochs=-1, checkpoint_every=steps, log_every=steps))
  return config


@pytest.fixture(scope='module')
def base(run_once):
  return run_once(
    'lora_base_digits',
    lambda d: trainer.train_and_evaluate(short(lora_base.get_config('digits'), 40), d),
  )


@pytest.fixture(scope='module')
def finetune(base, run_once):
  """(workdir, results) of a rank-4 fine-tuning of `base`, run once for all xdist workers."""
  workdir = run_once(
    'lora_finetune_rotated_r4',
    lambda d: trainer.train_and_evaluate(
      short(lora_finetune.get_config(f'rotated,4,digits,base={base}'), 20), d
    ),
  )
  with open(os.path.join(workdir, 'results.json')) as f:
    return workdir, json.load(f)


def _flat(workdir):
  return traverse_util.flatten_dict(jax.device_get(checkpoint.restore_params(workdir)[1]))


@pytest.mark.slow
def test_only_adapters_change(base, finetune):
  workdir, results = finetune
  assert results['params_trainable'] == 4 * (64 + 64 + 64 + 64 + 64 + 10)  # r (in + out)
  assert results['params_total'] == 8970 + results['params_trainable']
  base_params, tuned = _flat(base), _flat(workdir)
  adapters = {p for p in tuned if lora.is_adapter(p)}
  assert {p[:-1] for p in adapters} == {('hidden_0',), ('hidden_1',), ('head',)}
  assert set(tuned) - adapters == set(base_params)
  for path, value in base_params.items():
    np.testing.assert_array_equal(tuned[path], value, err_msg='/'.join(path))
  assert all(np.abs(tuned[p]).max() > 0 for p in adapters if p[-1] == lora.B_NAME)


@pytest.mark.slow
def test_checkpoint_reloads_as_adapted_model(finetune):
  workdir, results = finetune
  config, model, params = inference.load(workdir)
  assert isinstance(model, lora.Adapted) and config.dataset.transform == 'rotated'
  batch = data.get_eval_batch(config)
  correct = np.argmax(model.apply({'params': params}, batch['inputs']), -1) == batch['label']
  assert (correct * batch['mask']).sum() / batch['mask'].sum() == pytest.approx(
    results['eval_accuracy']
  )


@pytest.mark.slow
def test_init_from_a_base_of_another_model_fails_loudly(base, tmp_path):
  config = short(lora_finetune.get_config(f'rotated,2,digits,vit,base={base}'), 2)
  with pytest.raises(ValueError, match=r'is not a base of this LoRA model.*missing'):
    trainer.train_and_evaluate(config, str(tmp_path))


@pytest.mark.parametrize('variant', ['rotated', 'inverted', 'quantised'])
def test_transform_applies_to_train_and_eval_before_normalisation(variant):
  plain = lora_base.get_config('digits')
  config = lora_base.get_config(f'digits,variant={variant}')
  spec = data.get_spec('digits')
  transform = transforms.get_transform(variant)
  for get in (lambda c: next(data.get_train_data(c).batches(3)), data.get_eval_batch):
    x, y = get(plain), get(config)
    np.testing.assert_array_equal(x['label'], y['label'])
    raw = x['inputs'] * spec.std[0] + spec.mean[0]  # pixel values in [0, 1]
    want = (np.asarray(transform(raw)) - spec.mean[0]) / spec.std[0]
    np.testing.assert_allclose(y['inputs'], want, atol=1e-5)
    assert not np.allclose(x['inputs'], y['inputs'])


def test_scratch_targets_include_the_zero_initialised_head():
  config = lora_scratch.get_config('rotated,2,digits,vit')
  assert config.init_from == ''
  shapes = jax.eval_shape(
    lambda: modeling.create_model(config).init(
      jax.random.key(0), modeling.dummy_inputs(config), train=False
    )
  )['params']
  assert (
    'lora_b' in shapes['head'] and 'lora_a' in shapes['encoder']['block_0']['attention']['query']
  )


def test_seeds_of_the_study_combine_into_means_and_spreads():
  def result(root, seed, delta, unfinished=()):
    return dict(
      root=root,
      seeds=[seed],
      device=lora_table.machine.device_info(),
      dataset='mnist',
      model='mlp',
      eval_split='validation',
      ranks=[1],
      variants=['rotated'],
      params={'base': 10, 'r1': 2},
      steps={'base': 5, 'adaptation': 5},
      base={'plain': 0.9, 'rotated': 0.1 + delta},
      full_finetune={'rotated': 0.8 + delta},
      finetune={'1': {'rotated': 0.5 + delta}},
      scratch={} if unfinished else {'1': {'rotated': 0.3}},
      unfinished=list(unfinished),
    )

  both = lora_table.combine([result('s0', 0, 0.0), result('s1', 1, 0.02, ['scratch_rotated_r1'])])
  assert both['seeds'] == [0, 1] and both['unfinished'] == ['s1/scratch_rotated_r1']
  assert both['finetune']['1']['rotated'] == pytest.approx(0.51)
  assert both['spread']['finetune']['1']['rotated'] == pytest.approx(0.01)
  assert both['base']['plain'] == pytest.approx(0.9) and both['spread']['base']['plain'] == 0
  assert both['scratch'] == {}  # seed 1 did not finish it: no "mean" of seed 0 alone
  text = lora_table.markdown(both)
  assert '2 seeds (0, 1)' in text and '| 1 | 2 | 51.00% ±1.00 |' in text
  assert 'full fine-tuning' in text and '81.00% ±1.00' in text
  with pytest.raises(ValueError, match=r'--root=s1: its ranks \[1, 2\] is not that of --root=s0'):
    lora_table.combine([result('s0', 0, 0.0), dict(result('s1', 1, 0.0), ranks=[1, 2])])


@pytest.mark.slow
def test_study_table_reads_the_sweep_runs(base, tmp_path):
  root = tmp_path / 'runs'
  root.mkdir()
  os.symlink(base, root / 'base')
  runs = sweep.expand(
    dict(
      runs=lora_base.study_runs('digits', ranks=(1, 2), variants=('rotated',)),
      fixed={
        'train.num_steps': 5,
        'train.num_epochs': -1,
        'train.checkpoint_every': 5,
        'train.log_every': 5,
      },
    ),
    str(root),
  )
  assert [r.name for r in runs] == [
    'base',
    'full_rotated',
    'finetune_rotated_r1',
    'finetune_rotated_r2',
    'scratch_rotated_r1',
    'scratch_rotated_r2',
  ]
  for run in runs[1:-1]:  # scratch_rotated_r2 left unfinished
    trainer.train_and_evaluate(sweep.build_config(run), str(root / run.name))
  out = tmp_path / 'out'
  result = lora_table.main([f'--root={root}', f'--out={out}', '--quiet'])
  with open(out / 'lora.json') as f:
    saved = json.load(f)
  assert saved['ranks'] == [1, 2] and saved['params']['r2'] == 2 * 330
  assert saved['params']['full'] == 8970 and saved['variants'] == ['rotated']
  assert set(saved['finetune']) == {'1', '2'} and set(saved['scratch']) == {'1'}
  assert saved['unfinished'] == []  # never started: no workdir at all
  assert 0 <= saved['base']['rotated'] <= 1 and 'rotated' in saved['full_finetune']
  assert saved['base']['rotated'] == result['base']['rotated']
  assert saved['base']['rotated'] != saved['base']['plain']
  with open(out / 'lora.md') as f:
    text = f.read()
  assert '| r | trainable params | rotated |' in text and '\n| 2 | 660 |' in text
  assert 'full fine-tuning' in text and 'from scratch' in text
  with open(out / 'lora.png', 'rb') as f:
    assert f.read(8) == PNG
  twice = lora_table.main([f'--root={root},{root}', f'--out={out}', '--name=two', '--quiet'])
  assert twice['finetune'] == result['finetune'] and twice['spread']['finetune']['1'] == {
    'rotated': 0
  }
  assert twice['scratch'] == result['scratch']
  with pytest.raises(SystemExit, match='nope/base has no results.json'):  # one line, no table
    lora_table.main([f'--root={root},{tmp_path}/nope', f'--out={out}', '--name=bad', '--quiet'])
  assert not (out / 'bad.md').exists()
