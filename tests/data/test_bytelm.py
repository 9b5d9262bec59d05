"""Byte-level language modelling (data/text_bytes.py, the byte_lm task, configs/bytelm.py).

A corpus of three documents, as an .npz and as a folder of .txt files, read the
same; held-out documents never trained on; windows that score every byte once;
each bad corpus stopped in one line naming the file before any workdir is
written; a tiny run end to end with bits per byte and a held-out continuation.
"""

import contextlib
import json
import math
import os
import shutil

import main_runner
import numpy as np
import pytest

import data
from data import arrays
from data import sequences
from data import text_bytes
from efficient_attn import registry
from efficient_attn.layers import hybrid
from train import trainer
from train import validate
from train.tasks import byte_lm
from train.workdir import identity

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = [
  b'The film was a delight from start to end. ' * 3,
  'Un caf\u00e9 tr\u00e8s calme, a quiet story. '.encode('utf-8') * 2,
  b'Worst movie ever. ' * 4,
]
L = 16  # window, in bytes


def write_npz(path, docs=DOCS, **changes):
  arrays_ = dict(
    text_utf8=np.frombuffer(b''.join(docs), np.uint8),
    offsets=np.cumsum([0] + [len(d) for d in docs]),
  )
  arrays_.update(changes)
  np.savez(path, **{k: v for k, v in arrays_.items() if v is not None})
  return str(path)


def write_folder(path, docs=DOCS):
  os.makedirs(path)
  for i, doc in enumerate(docs):
    with open(os.path.join(path, f'review_{i}.txt'), 'wb') as f:
      f.write(doc)
  with open(os.path.join(path, 'cover.png'), 'wb') as f:  # binary: not a document
    f.write(b'\x89PNG\r\n\x1a\n\0\0\0\rIHDR')
  return str(path)


def test_an_npz_and_a_folder_of_text_files_read_the_same_documents(tmp_path):
  assert text_bytes.read_corpus(write_npz(tmp_path / 'c.npz')) == DOCS
  assert text_bytes.read_corpus(write_folder(tmp_path / 'texts')) == DOCS


def test_windows_score_every_byte_once_after_the_bytes_before_it():
  x, y = text_bytes.windows(DOCS, L)
  assert x.shape == y.shape and x.shape[1] == L
  rows = [-(-len(d) // L) for d in DOCS]
  assert len(x) == sum(rows)
  scored = y[y != sequences.IGNORE]
  assert bytes(scored.astype(np.uint8).tolist()) == b''.join(DOCS)  # each byte once, in order
  starts = np.cumsum([0] + rows[:-1])
  assert (x[starts, 0] == text_bytes.START).all()  # a document opens with the start token
  assert (x[:, 0] == text_bytes.START).sum() == len(DOCS)
  flat_x, flat_y = x[: rows[0]].reshape(-1), y[: rows[0]].reshape(-1)
  n = len(DOCS[0])
  np.testing.assert_array_equal(flat_x[1:n], flat_y[: n - 1])  # the byte before each one
  assert (flat_y[n:] == sequences.IGNORE).all() and (flat_x[n:] == 0).all()  # padding


def test_held_out_documents_are_never_trained_on():
  docs = [bytes([65 + i]) * (i + 1) for i in range(10)] + [b'', bytes([65]) * 1]
  split = text_bytes.split_documents(docs, validation_docs=3, seed=0)
  assert len(split['validation']) == 3 and 10 not in split['train'] + split['validation']
  assert not set(split['train']) & set(split['validation'])
  held = {docs[i] for i in split['validation']}
  assert not held & {docs[i] for i in split['train']}  # copies of a held-out text dropped
  assert split == text_bytes.split_documents(docs, validation_docs=3, seed=0)
  assert split != text_bytes.split_documents(docs, validation_docs=3, seed=1)
  assert len(text_bytes.split_documents(docs, 3, train_docs=2)['train']) == 2


# configs/bytelm.py


def parse(*args, arg='softmax'):
  """The config main.py builds from `--config=configs/bytelm.py:<arg> *args`."""
  return main_runner.parsed_config(f'configs/bytelm.py:{arg}', *args)


def packs(mechanism):
  """Whether `mechanism` keeps packed documents apart (packed rows, the config's default,
  need it; else the tests train one window a row)."""
  return all(d.segments for d in hybrid.registered(mechanism))


def load_config(corpus, cache, mechanism='softmax', *args):
  return parse(
    f'--config.dataset.data_dir={cache}',
    '--config.sample.prompt_bytes=6',
    '--config.sample.new_bytes=5',
    '--config.sample.num_samples=1',
    *args,
    arg=f'{mechanism},d_model=16,num_heads=2,depth=1,seq_len={L},data_dir={corpus},'
    f'validation_docs=1,batch_size=2,num_steps=4,packing={int(packs(mechanism))}',
  )


@pytest.mark.parametrize(
  'mechanism',
  sorted(set(registry.list_mechanisms()) - set(registry.names_where(lambda m: m.causal)))[:1],
)
def test_config_refuses_a_mechanism_without_a_causal_form_in_one_line(mechanism):
  with pytest.raises(SystemExit) as e:
    parse(arg=mechanism)
  assert '\n' not in str(e.value)
  assert f"configs/bytelm.py: mechanism '{mechanism}' has no causal form" in str(e.value)


@pytest.mark.parametrize(
  'change,message',
  [
    (
      '--config.sample.new_bytes=11',
      'config.sample.prompt_bytes=6 + new_bytes=11 exceed the '
      "model's context, config.dataset.max_length=16",
    ),
    (
      '--config.dataset.validation_docs=0',
      'config.dataset: text_bytes validation_docs=0 is not valid',
    ),
    (
      '--config.dataset.vocab_size=300',
      "config.dataset.vocab_size=300 is not valid for the "
      "byte dataset 'text_bytes'; valid choices: 256",
    ),
  ],
)
def test_config_fields_the_byte_task_cannot_have(change, message, tmp_path):
  config = load_config(write_npz(tmp_path / 'c.npz'), tmp_path / 'cache', 'softmax', change)
  with pytest.raises(validate.ConfigError) as e:
    validate.validate_config(config)
  assert str(e.value).startswith(message) and '\n' not in str(e.value), e.value


def test_continuations_need_a_decoding_form(tmp_path):
  without = sorted(
    set(registry.names_where(lambda m: m.causal))
    - set(registry.names_where(lambda m: bool(m.decode)))
  )
  if not without:
    pytest.skip('every causal mechanism decodes')
  config = load_config(write_npz(tmp_path / 'c.npz'), tmp_path / 'cache', without[0])
  with pytest.raises(
    validate.ConfigError,
    match='has no decoding form, which the continuations written after training need',
  ):
    validate.validate_config(config)
  config.sample.num_samples = 0
  validate.validate_config(config)


def bad_corpora(tmp_path):
  empty_dir = tmp_path / 'no_text'
  empty_dir.mkdir()
  (empty_dir / 'cover.png').write_bytes(b'\x89PNG\0binary')
  return [
    (write_npz(tmp_path / 'no_offsets.npz', offsets=None), "has no 'offsets' array"),
    (write_npz(tmp_path / 'no_text.npz', text_utf8=None), "has no 'text_utf8' array"),
    (
      write_npz(
        tmp_path / 'int_text.npz',
        text_utf8=np.frombuffer(b''.join(DOCS), np.uint8).astype(np.int32),
      ),
      "'text_utf8' must be uint8",
    ),
    (
      write_npz(tmp_path / 'float_offsets.npz', offsets=np.cumsum([0.0] + [len(d) for d in DOCS])),
      "'offsets' must be integers",
    ),
    (
      write_npz(tmp_path / 'short_offsets.npz', offsets=np.asarray([0, 5])),
      "'offsets' must rise from 0 to len(text_utf8)",
    ),
    (write_npz(tmp_path / 'empty.npz', docs=[b'', b'']), 'the corpus is empty'),
    (
      write_npz(tmp_path / 'one_doc.npz', docs=DOCS[:1]),
      '1 non-empty documents cannot hold out validation_docs=1',
    ),
    (str(empty_dir), 'the folder holds no text file'),
    (str(tmp_path / 'missing.npz'), '(config.dataset.corpus) does not exist'),
  ]


def test_a_bad_corpus_is_one_line_naming_it_before_any_workdir(tmp_path):
  for corpus, message in bad_corpora(tmp_path):
    config = load_config(corpus, tmp_path / 'cache')
    workdir = tmp_path / 'run'
    arrays.clear_cache()
    with pytest.raises(validate.ConfigError) as e:
      trainer.train_and_evaluate(config, str(workdir))
    assert str(e.value).startswith(corpus) and message in str(e.value), e.value
    assert '\n' not in str(e.value)
    assert not workdir.exists()


# End to end, as main.py runs it


def _train(workdir):
  corpus = write_folder(f'{workdir}_corpus')
  with open(f'{workdir}_stdout.txt', 'w') as out, contextlib.redirect_stdout(out):
    trainer.train_and_evaluate(load_config(corpus, f'{workdir}_cache', 'linear'), workdir)


@pytest.mark.slow
def test_tiny_run_reports_bits_per_byte_and_continues_a_held_out_prompt(run_once):
  workdir = run_once('bytelm', _train)
  with open(os.path.join(workdir, 'results.json')) as f:
    results = json.load(f)
  assert results['task'] == 'byte_lm' and results['dataset'] == 'text_bytes'
  assert results['eval_split'] == 'validation' and results['steps'] == 4
  assert results['eval_bits_per_byte'] == pytest.approx(results['eval_loss'] / math.log(2))
  with open(os.path.join(workdir, 'samples.json')) as f:
    samples = json.load(f)['samples']
  assert len(samples) == 1
  prompt = samples[0]['prompt'].encode('utf-8')
  assert len(prompt) == 6 and any(d.startswith(prompt) for d in DOCS)  # a held-out start
  assert samples[0]['continuation']  # new_bytes sampled after it
  assert os.path.exists(os.path.join(workdir, 'samples.txt'))
  with open(f'{workdir}_stdout.txt') as f:  # the last line says where the samples are
    lines = f.read().splitlines()
  final, last = lines[-2:]
  assert final.endswith(f'results in {workdir}/results.json'), final
  assert last == f'outputs in {workdir}/samples.json, {workdir}/samples.txt', last
  # the rate of real bytes: the progress lines' tok/s, the results' steady_tokens_per_sec
  assert results['steady_tokens_per_sec'] > 0
  assert any(line.startswith('step 4/4 |') and ' tok/s | eta ' in line for line in lines), lines
  with open(os.path.join(workdir, 'config.json')) as f:  # packed wherever linear can be
    assert json.load(f)['dataset']['packing'] == packs('linear')


# Packed rows (the config's default)


def test_the_byte_lm_packs_by_default_and_the_argument_turns_it_off():
  assert parse().dataset.packing is True
  assert parse(arg='softmax,packing=0').dataset.packing is False


def test_packing_needs_a_mechanism_that_keeps_documents_apart_in_one_line(tmp_path):
  unpackable = [
    m for m in registry.names_where(lambda m: m.causal and bool(m.decode)) if not packs(m)
  ]
  if not unpackable:
    pytest.skip('every causal mechanism with a decoding form keeps packed documents apart')
  mechanism = unpackable[0]
  config = parse(arg=f'{mechanism},seq_len={L},data_dir={write_npz(tmp_path / "c.npz")}')
  with pytest.raises(validate.ConfigError) as e:
    validate.validate_config(config)
  message = str(e.value)
  assert message.startswith(
    f"config.dataset.packing=True needs a mechanism that keeps packed documents apart; "
    f"config.attention.mechanism='{mechanism}' cannot ("
  ) and message.endswith('; or set config.dataset.packing=False'), message
  assert '\n' not in message
  config.dataset.packing = False
  validate.validate_config(config)


def test_a_resume_with_the_other_packing_is_another_config():
  stored = lambda config: json.loads(json.dumps(config.to_dict()))  # as config.json holds it
  packed, unpacked = stored(parse()), stored(parse(arg='softmax,packing=0'))
  assert identity.differences(unpacked, packed) == ['dataset.packing: False -> True']
  before = stored(parse(arg='softmax,packing=0'))  # a run stored before the field existed
  del before['dataset']['packing']
  assert identity.differences(before, unpacked) == []
  assert identity.differences(before, packed) == ['dataset.packing: False -> True']


def test_packed_splits_reach_the_batches_with_their_segment_ids(tmp_path):
  config = load_config(write_npz(tmp_path / 'c.npz'), tmp_path / 'cache', 'softmax')
  config.dataset.packing = True
  split = arrays.get_split(config, 'train')
  assert split.segment_ids is not None and split.segment_ids.shape == split.inputs.shape
  batch = next(data.get_train_data(config).batches())
  assert batch['segment_ids'].shape == batch['inputs'].shape
  rows = [np.flatnonzero((split.inputs == row).all(1))[0] for row in batch['inputs']]
  np.testing.assert_array_equal(batch['segment_ids'], split.segment_ids[rows])
  held = next(data.get_eval_data(config).batches())  # padding rows: segment 0 throughout
  assert held['segment_ids'].shape == held['inputs'].shape
  assert (held['segment_ids'][held['mask'] == 0] == 0).all()
  # the held-out document continues from the same prompt, packed or not
  unpacked = load_config(write_npz(tmp_path / 'c.npz'), tmp_path / 'cache', 'softmax')
  unpacked.dataset.packing = False
  prompt = byte_lm.prompts(config, 5, 6)
  assert prompt.shape == (1, 6) and any(d.startswith(bytes(prompt[0].tolist())) for d in DOCS)
  np.testing.assert_array_equal(prompt, byte_lm.prompts(unpacked, 5, 6))


def test_the_docs_quote_the_message_a_folder_without_text_gets(tmp_path):
  """docs/sequence_labelling.md's example: a corpus folder holding no text file."""
  with open(os.path.join(ROOT, 'docs', 'sequence_labelling.md')) as f:
    quoted = next(line.strip() for line in f if 'holds no text file;' in line)
  folder = tmp_path / 'notes'
  folder.mkdir()
  (folder / 'scan.png').write_bytes(b'\x89PNG\0')
  config = load_config(str(folder), tmp_path / 'cache')
  arrays.clear_cache()
  with pytest.raises(validate.ConfigError) as e:
    validate.resolved(config)
  assert f'Invalid config: {e.value}' == quoted.replace('/tmp/h_doc/notes', str(folder))


def _stored_run(mechanism, seed, bits_per_byte):
  return dict(
    mechanism=mechanism,
    seed=seed,
    workdir=f'/gone/bytelm-{mechanism}-seed{seed}',
    finished=True,
    bits_per_byte=bits_per_byte,
    accuracy=0.5,
    loss=1.0,
    steps=10,
    examples_per_sec=20.0,
    wall_time_s=30.0,
    params=1000,
    decode_state_bytes=64,
    context=16,
    batch_size=4,
    samples=dict(settings=dict(temperature=1.0), samples=[dict(prompt='The', continuation=' end')]),
  )


def test_a_report_gives_back_its_runs_and_a_later_one_replaces_its_own(tmp_path):
  """studies/bytelm/report.py: a report .json is a source (its workdirs gone): the same
  table again; a later source's run of the same mechanism and seed wins; the seeds give
  the mean and half the range."""
  from studies.bytelm import report  # pylint: disable=g-import-not-at-top

  baselines = dict(unigram=4.5, bigram=3.5, train_bytes=100, validation_bytes=50)
  runs = [
    _stored_run('softmax', 0, 2.0),
    _stored_run('softmax', 1, 3.0),
    dict(mechanism='linear', seed=0, workdir='/gone/bytelm-linear-seed0', finished=False),
  ]
  (tmp_path / 'a.json').write_text(json.dumps(dict(runs=runs, count_baselines=baselines)))
  first = report.write_report([str(tmp_path / 'a.json')], str(tmp_path / 'out'), 'a', 'cmd')
  assert first['runs'] == runs and first['count_baselines'] == baselines
  assert first['summary']['softmax']['bits_per_byte'] == 2.5
  assert first['summary']['softmax']['spread'] == 0.5
  assert first['summary']['linear'] == dict(seeds=[])
  assert '| softmax | 0,1 | 2.500 ± 0.500 |' in (tmp_path / 'out' / 'a.md').read_text()
  assert (tmp_path / 'out' / 'a.png').exists()
  (tmp_path / 'b.json').write_text(json.dumps(dict(runs=[_stored_run('softmax', 1, 2.0)])))
  again = report.write_report(
    [str(tmp_path / 'out' / 'a.json'), str(tmp_path / 'b.json')], str(tmp_path / 'out'), 'b', 'cmd'
  )
  assert [r['bits_per_byte'] for r in again['runs'] if r['finished']] == [2.0, 2.0]
  assert again['count_baselines'] == baselines  # the earlier report's, none since


@pytest.mark.parametrize(
  'text,problem',
  [
    (None, 'no such file'),
    ('{"runs": [', 'it does not parse'),
    ('folder', 'cannot be read'),
    ('[1, 2]', 'it has no "runs" list'),
    ('{"runs": [{"mechanism": "softmax"}]}', 'no "runs"'),
  ],
)
def test_a_file_that_is_no_byte_lm_report_is_one_line_naming_it(tmp_path, text, problem):
  from studies.bytelm import report  # pylint: disable=g-import-not-at-top

  path = tmp_path / 'r.json'
  if text == 'folder':
    path.mkdir()
  elif text is not None:
    path.write_text(text)
  with pytest.raises(SystemExit) as e:
    report.gather([str(path)])
  assert str(e.value).startswith(f'{path}: not a report JSON (') and problem in str(e.value)
  assert '\n' not in str(e.value)


@pytest.mark.slow
def test_the_report_of_a_trained_run_reads_back_the_same(run_once, tmp_path):
  """The report of the tiny run (bits per byte, decoding state, continuation, count
  baselines), then a report of its .json alone, the workdir gone: the same content."""
  from studies.bytelm import report  # pylint: disable=g-import-not-at-top

  workdir = run_once('bytelm', _train)
  shutil.copytree(workdir, tmp_path / 'runs' / 'bytelm-linear-seed0')
  first = report.write_report([str(tmp_path / 'runs')], str(tmp_path / 'a'), 'r', 'cmd')
  [run] = first['runs']
  assert run['finished'] and run['steps'] == 4 and run['decode_state_bytes'] > 0
  assert run['samples']['samples'][0]['continuation']
  assert first['count_baselines']['bigram'] > 0 and first['count_baselines']['unigram'] > 0
  shutil.rmtree(tmp_path / 'runs')
  again = report.write_report([str(tmp_path / 'a' / 'r.json')], str(tmp_path / 'b'), 'r', 'cmd')
  assert again == json.loads((tmp_path / 'a' / 'r.json').read_text())
  assert (tmp_path / 'b' / 'r.md').read_text() == (tmp_path / 'a' / 'r.md').read_text()
