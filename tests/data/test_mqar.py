"""MQAR (Arora et al. 2023, "Zoology") and the sequence-labelling .npz format, end to end.

The generator's properties (key and value halves, the pairs first, one query per
key at power-law gaps, only the queries scored with the paired value, seeds,
disjoint splits); every bad sequence-labelling file stopped in one line naming
the file before any workdir is written; configs/mqar.py for each mechanism with
a causal form, and refused for the others; a tiny run trained and evaluated as
main.py does, and evaluated on another file of the task.
"""

import json
import os

import jax
import numpy as np
import pytest
import shared_runs
from shared_runs import L  # the tiny task of these tests: vocabulary, length, pairs
from shared_runs import P  # the tiny task of these tests: vocabulary, length, pairs
from shared_runs import V  # the tiny task of these tests: vocabulary, length, pairs

from data import arrays
from data import mqar
from data import packing
from data import sequences
from efficient_attn import registry
from train import trainer
from train import validate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope='module')
def drawn():
  return mqar.generate(500, (0, 1), vocab_size=V, seq_len=L, num_kv_pairs=P)


def test_pairs_open_the_sequence_keys_and_values_from_the_two_halves(drawn):
  x, y = drawn
  assert x.shape == y.shape == (500, L) and x.dtype == y.dtype == np.int32
  keys, values = x[:, 0 : 2 * P : 2], x[:, 1 : 2 * P : 2]
  assert keys.min() >= 1 and keys.max() < V // 2
  assert values.min() >= V // 2 and values.max() < V
  for row in (keys, values):  # distinct within an example
    s = np.sort(row, axis=1)
    assert not (s[:, 1:] == s[:, :-1]).any()
  assert (y[:, : 2 * P] == sequences.IGNORE).all()  # the pairs themselves are not scored
  assert x.min() >= 0 and x.max() < V
  filler = np.ones_like(x, bool)
  filler[:, : 2 * P] = False
  filler[y != sequences.IGNORE] = False
  assert len(np.unique(x[filler])) > V * 0.9  # random tokens from the whole vocabulary


def test_each_key_is_queried_once_and_scored_with_its_value(drawn):
  """Only the queries are scored: P per example, at even offsets after the pairs, the
  input a key of the example and the label the value paired with it earlier."""
  x, y = drawn
  for i in range(len(x)):
    pairs = dict(zip(x[i, 0 : 2 * P : 2], x[i, 1 : 2 * P : 2]))
    where = np.flatnonzero(y[i] != sequences.IGNORE)
    assert len(where) == P and where.min() >= 2 * P and ((where - 2 * P) % 2 == 0).all()
    assert sorted(x[i, where]) == sorted(pairs)  # every key once
    assert [pairs[k] for k in x[i, where]] == list(y[i, where])


def test_query_gaps_follow_the_power_law():
  """One pair: the query's slot is drawn with weight a (g + 1)^(a - 1); a = 0.01 puts
  most queries in the first slots, a = 1 spreads them evenly."""
  slots = (L - 2) // 2
  for power_a in (0.01, 1.0):
    x, y = mqar.generate(4000, 3, vocab_size=V, seq_len=L, num_kv_pairs=1, power_a=power_a)
    gap = (np.argmax(y != sequences.IGNORE, axis=1) - 2) // 2
    seen = np.bincount(gap, minlength=slots) / len(gap)
    np.testing.assert_allclose(seen, mqar.gap_weights(slots, power_a), atol=0.03)
  assert mqar.gap_weights(slots, 0.01)[0] > 10 * mqar.gap_weights(slots, 0.01)[-1]


def test_seeds_reproduce_and_differ(drawn):
  again = mqar.generate(500, (0, 1), vocab_size=V, seq_len=L, num_kv_pairs=P)
  np.testing.assert_array_equal(drawn[0], again[0])
  np.testing.assert_array_equal(drawn[1], again[1])
  other = mqar.generate(500, (0, 2), vocab_size=V, seq_len=L, num_kv_pairs=P)
  assert not np.array_equal(drawn[0], other[0])


def test_splits_are_disjoint_and_written_once(tmp_path):
  """8 tokens, 2 pairs (keys 1..2, values 3..5) and 2 filler tokens of 6: 864 possible
  sequences, so splits of 100 and 30 would share some unless the later one excludes the
  earlier; once the earlier splits hold them all, a later one cannot be drawn."""
  task = dict(vocab_size=6, seq_len=8, num_kv_pairs=2)
  sizes = {'train': 100, 'test': 30}
  paths = mqar.write_splits(str(tmp_path), seed=0, sizes=sizes, verbose=False, **task)
  rows = [{r.tobytes() for r in np.load(p)['inputs']} for p in paths]
  assert len(rows[1]) > 1 and not rows[0] & rows[1]
  fresh = mqar.generate(30, mqar.split_seed(0, 'test'), **task)[0]
  assert {r.tobytes() for r in fresh} & rows[0]  # without the exclusion they would meet
  stamps = [os.stat(p).st_mtime_ns for p in paths]
  mqar.write_splits(str(tmp_path), seed=0, sizes=sizes, verbose=False, **task)
  assert [os.stat(p).st_mtime_ns for p in paths] == stamps  # up to date: kept
  with pytest.raises(ValueError, match='cannot draw 10 sequences outside the 864 of'):
    mqar.write_splits(str(tmp_path), seed=0, sizes={'a': 20_000, 'b': 10}, verbose=False, **task)


@pytest.mark.parametrize(
  'settings,message',
  [
    (dict(seq_len=30, num_kv_pairs=8), 'MQAR seq_len=30 is too short for num_kv_pairs=8'),
    (dict(vocab_size=16, num_kv_pairs=8), 'MQAR vocab_size=16 is too small for num_kv_pairs=8'),
    (dict(num_kv_pairs=0), 'MQAR num_kv_pairs=0 is not valid'),
    (dict(power_a=0.0), 'MQAR power_a=0.0 is not valid'),
  ],
)
def test_settings_the_task_cannot_have_are_one_line(settings, message):
  full = dict(vocab_size=8192, seq_len=128, num_kv_pairs=8, power_a=0.01, **{})
  full.update(settings)
  with pytest.raises(ValueError) as e:
    mqar.check_settings(**full)
  assert str(e.value).startswith(message) and '\n' not in str(e.value)
  config = load_config('softmax')  # the same through a config's fields, before any data
  config.dataset.update(
    dict(
      max_length=full['seq_len'],
      vocab_size=full['vocab_size'],
      num_kv_pairs=full['num_kv_pairs'],
      power_a=full['power_a'],
    )
  )
  with pytest.raises(validate.ConfigError, match=message):
    validate.validate_config(config)


# configs/mqar.py

parse = shared_runs.parse_mqar


def load_config(mechanism):
  return parse(arg=f'{mechanism},d_model=32,seq_len={L},num_kv_pairs={P},vocab_size={V}')


CAUSAL = registry.names_where(lambda m: m.causal)


@pytest.mark.parametrize('mechanism', CAUSAL)
def test_config_validates_for_every_causal_mechanism(mechanism):
  config = load_config(mechanism)
  validate.validate_config(config)
  assert config.attention.mechanism == mechanism and config.model.kind == 'causal'
  assert config.task == 'sequence_labelling' and config.dataset.vocab_size == V


@pytest.mark.parametrize('mechanism', sorted(set(registry.list_mechanisms()) - set(CAUSAL)))
def test_config_refuses_a_mechanism_without_a_causal_form_in_one_line(mechanism):
  with pytest.raises(SystemExit) as e:
    load_config(mechanism)
  message = str(e.value)
  assert '\n' not in message and 'Traceback' not in message
  assert f"configs/mqar.py: mechanism '{mechanism}' has no causal form" in message
  assert ', '.join(CAUSAL) in message


def test_config_defaults_are_zoologys_cell():
  config = parse(arg='linear')
  d = config.dataset
  assert (d.vocab_size, d.max_length, d.num_kv_pairs, d.power_a) == (8192, 128, 8, 0.01)
  assert (config.model.depth, config.model.d_model) == (2, 64)


def test_packed_splits_hold_the_same_sequences_k_to_a_row(tmp_path):
  task = dict(vocab_size=V, seq_len=L, num_kv_pairs=P)
  sizes = {'train': 10, 'test': 5}
  plain = mqar.write_splits(str(tmp_path / 'a'), seed=0, sizes=sizes, verbose=False, **task)
  packed = mqar.write_splits(
    str(tmp_path / 'b'), seed=0, sizes=sizes, verbose=False, row_length=3 * L + 5, **task
  )
  assert os.path.basename(packed[0]).startswith(f'mqar_v{V}_l{L}_kv{P}_a0.01_r{3 * L + 5}_')
  for a, b in zip(plain, packed):
    rows, file = np.load(a), np.load(b)
    assert file['inputs'].shape == (-(-len(rows['inputs']) // 3), 3 * L + 5)
    spans = list(packing.spans(file['segment_ids']))
    assert [(r, e - s) for r, s, e in spans] == [(i // 3, L) for i in range(len(rows['inputs']))]
    for key in ('inputs', 'labels'):  # the same sequences, in order
      np.testing.assert_array_equal(
        np.stack([file[key][r, s:e] for r, s, e in spans]), rows[key], err_msg=key
      )
    assert (file['labels'][file['segment_ids'] == 0] == sequences.IGNORE).all()
  np.testing.assert_array_equal(mqar.sequences_of(packed[0], L), np.load(plain[0])['inputs'])


def test_the_config_packs_k_sequences_to_a_row_and_keeps_64_a_step():
  d = parse(arg=f'softmax,seq_len={L},num_kv_pairs={P},vocab_size={V},packing=4').dataset
  assert (d.packing, d.seq_len, d.max_length, d.batch_size) == (True, L, 4 * L, 16)
  d = load_config('softmax').dataset
  assert (d.packing, d.max_length, d.batch_size, 'seq_len' in d) == (False, L, 64, False)


@pytest.mark.parametrize(
  'overrides,message',
  [
    (
      {'dataset.seq_len': L // 2},
      f'config.dataset.seq_len={L // 2} is not valid without packing: each MQAR sequence is '
      f'a row of config.dataset.max_length={L}; valid choices: 0, {L}',
    ),
    (
      {'dataset.packing': True, 'dataset.seq_len': 2 * L},
      f'config.dataset: MQAR row_length={L} cannot hold a sequence of seq_len={2 * L}',
    ),
  ],
)
def test_packing_settings_the_task_cannot_have_are_one_line(overrides, message):
  config = load_config('softmax')
  with config.unlocked():
    for path, value in overrides.items():
      config.dataset[path.split('.')[1]] = value
  with pytest.raises(validate.ConfigError) as e:
    validate.validate_config(config)
  assert str(e.value).startswith(message) and '\n' not in str(e.value), e.value


@pytest.mark.parametrize(
  'overrides,message',
  [
    (
      {'dataset.vocab_size': 0},
      "config.dataset.vocab_size=0 is not valid for the sequence dataset 'mqar'; it must be > 0",
    ),
    (
      {'dataset.num_classes': 10},
      "config.dataset.num_classes=10 is not valid for the sequence "
      f"dataset 'mqar', whose labels are tokens; valid choices: 0, {V}",
    ),
    (
      {'dataset.holdout': 0.1},
      "config.dataset.holdout=0.1 is not valid for the sequence dataset 'mqar'",
    ),
    (
      {'task': 'classification'},
      "config.model.kind='causal' is not valid for config.task='classification'",
    ),
    (
      {'task': 'pixel_lm'},
      "config.task='pixel_lm' is not valid for the sequence dataset "
      "'mqar'; valid choices: sequence_labelling",
    ),
    (
      {'model.kind': 'text'},
      "config.model.kind='text' is not valid for the sequence dataset "
      "'mqar'; valid choices: causal",
    ),
  ],
)
def test_config_fields_a_sequence_dataset_cannot_have(overrides, message):
  config = load_config('softmax')
  for path, value in overrides.items():
    group, _, name = path.rpartition('.')
    (config[group] if group else config)[name] = value
  with pytest.raises(validate.ConfigError) as e:
    validate.validate_config(config)
  assert str(e.value).startswith(message) and '\n' not in str(e.value), e.value


# The sequence-labelling format: bad files


def write(path, **arrays_):
  np.savez(path, **arrays_)
  return str(path)


def good(n=8, length=L):
  x, y = mqar.generate(n, 5, vocab_size=V, seq_len=length, num_kv_pairs=P)
  return dict(inputs=x, labels=y)


def bad_files():
  g = good()
  return [
    ('no_labels', dict(inputs=g['inputs']), "has no 'labels' array"),
    ('no_inputs', dict(labels=g['labels'], x=g['inputs']), "has no 'inputs' array"),
    (
      'float_inputs',
      dict(g, inputs=g['inputs'].astype(np.float32)),
      "'inputs' must be integers, got float32",
    ),
    (
      'float_labels',
      dict(g, labels=g['labels'].astype(np.float64)),
      "'labels' must be integers, got float64",
    ),
    (
      'flat',
      dict(inputs=g['inputs'][0], labels=g['labels'][0]),
      "'inputs' must be [n, length], got shape [32]",
    ),
    (
      'lengths_differ',
      dict(g, labels=g['labels'][:, :-1]),
      'inputs [8, 32] and labels [8, 31] must have the same shape',
    ),
    (
      'rows_differ',
      dict(g, labels=g['labels'][:-1]),
      'inputs [8, 32] and labels [7, 32] must have the same shape',
    ),
    (
      'label_at_vocab',
      dict(g, labels=np.where(g['labels'] >= 0, V, -100)),
      f'labels must be token ids in 0..{V - 1}',
    ),
    (
      'label_minus_one',
      dict(g, labels=np.where(g['labels'] >= 0, -1, -100)),
      'or -100 (not scored), got -1',
    ),
    (
      'label_below',
      dict(g, labels=np.where(g['labels'] >= 0, g['labels'], -101)),
      'or -100 (not scored), got -101',
    ),
    ('input_at_vocab', dict(g, inputs=g['inputs'] + V), f'inputs must be token ids in 0..{V - 1}'),
    (
      'nothing_scored',
      dict(g, labels=np.full_like(g['labels'], -100)),
      'every label is -100, so no position is scored',
    ),
    (
      'too_long',
      good(length=2 * L),
      f'sequences of {2 * L} tokens exceed config.dataset.max_length={L}',
    ),
  ]


@pytest.mark.parametrize('name,content,message', bad_files(), ids=[b[0] for b in bad_files()])
def test_a_bad_file_is_one_line_naming_it_before_any_workdir(name, content, message, tmp_path):
  """Training on the file, and evaluating a run on it, stop with one line naming the file
  and the problem; training writes no workdir, and evaluation (of a run, here one whose
  checkpoints folder exists: a missing one is refused first) writes nothing into it."""
  path = write(tmp_path / f'{name}.npz', **content)
  config = load_config('softmax')
  config.dataset.update(dict(source='arrays', data_dir=path, eval_split='train'))
  arrays.clear_cache()
  workdir = tmp_path / 'run'
  evaluated = tmp_path / 'trained'
  (evaluated / 'checkpoints').mkdir(parents=True)
  for run, folder in ((trainer.train_and_evaluate, workdir), (trainer.evaluate, evaluated)):
    with pytest.raises(validate.ConfigError) as e:
      run(config, str(folder))
    assert str(e.value).startswith(path) and message in str(e.value), e.value
    assert '\n' not in str(e.value)
  assert not workdir.exists()
  assert [p.relative_to(evaluated) for p in evaluated.rglob('*')] == [
    evaluated.joinpath('checkpoints').relative_to(evaluated)
  ]


def test_a_shorter_file_is_padded_unscored(tmp_path):
  g = good(length=L - 6)
  examples = arrays.Examples(g['inputs'], g['labels'], 'short.npz')
  sequences.check(examples, V, L)
  x, y = sequences.pad(examples, L)
  assert x.shape == y.shape == (8, L)
  assert (x[:, L - 6 :] == 0).all() and (y[:, L - 6 :] == sequences.IGNORE).all()
  np.testing.assert_array_equal(y[:, : L - 6], g['labels'])


# The task: cross-entropy and accuracy on the scored positions only


def test_scored_gathers_position_and_label_pairs():
  labels = np.full((3, 6), -100, np.int32)
  labels[0, [1, 4]], labels[1, 5] = (2, 7), 3
  pairs = sequences.scored(labels)
  assert pairs.shape == (3, 2, 2) and pairs.dtype == np.int32
  assert pairs[0].tolist() == [[1, 2], [4, 7]]
  assert pairs[1].tolist() == [[5, 3], [0, -100]]
  assert pairs[2].tolist() == [[0, -100], [0, -100]]


def test_loss_and_accuracy_count_only_scored_positions():
  """The vocabulary head runs at the scored positions only (the model gets them); the loss
  and accuracy match numpy on those positions of the real rows, and padding pairs and
  padding rows (mask 0) change nothing."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  from train.tasks import sequence_labelling  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(0)
  labels = np.full((3, 6), -100, np.int32)
  labels[0, [1, 4]], labels[1, 5], labels[2, 0] = (2, 7), 3, 1
  pairs = sequences.scored(labels)  # [3, 2, 2]
  mask = np.asarray([1.0, 1.0, 0.0], np.float32)
  logits = rng.normal(size=(3, 6, 8)).astype(np.float32)  # at every position

  def run(values):
    def apply(variables, inputs, *, train, rngs, positions):
      del variables, inputs, train, rngs
      return jnp.take_along_axis(jnp.asarray(values), positions[..., None], axis=1)

    model = type('Model', (), {'apply': staticmethod(apply)})
    batch = {'inputs': np.zeros((3, 6), np.int32), 'label': pairs, 'mask': mask}
    return sequence_labelling.loss_and_metrics(model, None, batch, train=False)

  loss, sums = run(logits)
  rows, cols = np.asarray([0, 0, 1]), np.asarray([1, 4, 5])
  z = logits[rows, cols]
  nll = -(z[np.arange(3), labels[rows, cols]] - np.log(np.exp(z).sum(-1)))
  assert float(sums['count']) == 3
  np.testing.assert_allclose(float(loss), nll.mean(), rtol=1e-5)
  assert float(sums['accuracy']) == (z.argmax(-1) == labels[rows, cols]).sum()
  changed = logits.copy()
  changed[labels == -100] = 9.0
  changed[2] = -9.0
  loss2, sums2 = run(changed)
  assert float(loss2) == pytest.approx(float(loss)) and float(sums2['count']) == 3


def test_causal_model_logits_at_positions_are_those_of_the_full_output():
  import jax  # pylint: disable=g-import-not-at-top

  from efficient_attn import models as ea  # pylint: disable=g-import-not-at-top

  model = ea.CausalTransformer(
    ea.TransformerConfig(d_model=8, depth=1, num_heads=2, mlp_dim=8, max_length=6), vocab_size=10
  )
  tokens = np.arange(12, dtype=np.int32).reshape(2, 6) % 10
  params = model.init(jax.random.key(0), tokens)
  positions = np.asarray([[1, 5], [0, 0]], np.int32)
  full = model.apply(params, tokens)
  some = model.apply(params, tokens, positions=positions)
  np.testing.assert_allclose(some, np.take_along_axis(full, positions[..., None], 1), atol=1e-6)


# End to end, as main.py runs it

TINY, SIZES = shared_runs.TINY_MQAR, shared_runs.MQAR_SIZES


@pytest.fixture(scope='module')
def mqar_run(run_once):
  workdir = run_once('mqar', shared_runs.train_tiny_mqar)
  with open(os.path.join(workdir, 'results.json')) as f:
    return workdir, json.load(f)


@pytest.mark.slow
def test_tiny_run_trains_and_evaluates(mqar_run):
  """After a few steps the loss on the scored positions is below log(vocabulary): the
  model has learned where the answers come from (the value half)."""
  workdir, results = mqar_run
  assert results['task'] == 'sequence_labelling' and results['dataset'] == 'mqar'
  assert results['steps'] == 24 and results['eval_split'] == 'test'
  assert results['device'] == jax.devices()[0].device_kind  # 'cpu' here
  assert results['eval_loss'] < np.log(V) and 0.0 <= results['eval_accuracy'] <= 1.0
  sizes = parse(*SIZES, arg=TINY).dataset.sizes.to_dict()  # the run's, in the config's order
  assert os.path.exists(mqar.split_path(f'{workdir}_data', 'test', V, L, P, 0.01, sizes=sizes))


@pytest.mark.slow
def test_eval_on_another_file_of_the_task(mqar_run, tmp_path):
  """--mode=eval with the arrays source on a file of the task that the run never saw."""
  workdir, results = mqar_run
  # Fewer sequences than one training batch: evaluation checks only what it reads.
  x, y = mqar.generate(20, 99, vocab_size=V, seq_len=L, num_kv_pairs=P)
  path = write(tmp_path / 'other.npz', inputs=x, labels=y)
  config = parse(
    f'--config.dataset.data_dir={path}',
    '--config.dataset.source=arrays',
    '--config.dataset.eval_split=train',
    *SIZES,
    arg=TINY,
  )
  values = trainer.evaluate(config, workdir)
  assert values['loss'] < np.log(V) and 0.0 <= values['accuracy'] <= 1.0
  with open(os.path.join(workdir, 'eval_results.json')) as f:
    stored = json.load(f)
  assert stored['step'] == results['steps'] and stored['split'] == 'train'


def test_the_docs_quote_the_message_a_bad_file_gets(tmp_path):
  """docs/sequence_labelling.md's example: 200 sequences (seed 7) whose labels use -1."""
  with open(os.path.join(ROOT, 'docs', 'sequence_labelling.md')) as f:
    quoted = next(line.strip() for line in f if line.strip().startswith('Invalid config:'))
  x, y = mqar.generate(200, 7, vocab_size=V, seq_len=L, num_kv_pairs=P)
  path = write(tmp_path / 'bad.npz', inputs=x, labels=np.where(y >= 0, y, -1))
  config = load_config('linear')
  config.dataset.update(dict(source='arrays', data_dir=path, eval_split='train'))
  arrays.clear_cache()
  with pytest.raises(validate.ConfigError) as e:
    validate.resolved(config)
  assert f'Invalid config: {e.value}' == quoted.replace('/tmp/h_doc/bad.npz', path)
