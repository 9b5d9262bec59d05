"""The byte LM's corpus: any text file or folder, a default that ships, a bucket, its sha256.

`configs/bytelm.py` with no corpus trains on Python's own reference docs
(`builtin:python_docs`), so it runs from a fresh clone; `--config.dataset.corpus`
takes a text file (its paragraphs are the documents), a folder (every text file in
it, in sorted order) or an `.npz`, local or in a bucket. The run stores the corpus's
sha256 with its config and refuses, in one line, to resume on edited text.
"""

import contextlib
import hashlib
import io
import json
import os

import fake_gcs
import main_runner
import numpy as np
import pytest

from data import arrays
from data import cache_folder
from data import text_bytes
from efficient_attn import registry
from train import trainer
from train import validate
from train import workdir as workdir_lib
from train.tasks import byte_lm

TEXT = (
  b'The first paragraph,\nits second line.\n\n\n'
  b'A second one, after two blank lines.\r\n  \r\n'
  b'    An indented third.\n'
)
PARAGRAPHS = [
  b'The first paragraph,\nits second line.',
  b'A second one, after two blank lines.',
  b'    An indented third.',
]
BINARY = b'\x89PNG\r\n\x1a\n\0\0\0\rIHDR'


def packs(mechanism):
  """1 where `mechanism` keeps packed documents apart (the config's default packing needs
  it), else 0: one window a row."""
  return int(registry.get_mechanism(mechanism).segments)


@pytest.fixture
def cache(monkeypatch, tmp_path):
  """Generated data under tmp_path (never the user's cache); returns the folder."""
  monkeypatch.setenv(cache_folder.CACHE_VARIABLE, str(tmp_path / 'cache'))
  return tmp_path / 'cache'


def write_tree(root):
  """A folder corpus: texts at two depths, a binary file and a hidden one beside them."""
  (root / 'b_sub').mkdir(parents=True)
  (root / 'b_sub' / 'inner.md').write_bytes(b'Inside a subfolder.')
  (root / 'a.txt').write_bytes(b'First by name.')
  (root / 'c.rst').write_bytes(b'Last by name.')
  (root / 'logo.png').write_bytes(BINARY)
  (root / '.hidden.txt').write_bytes(b'left out')
  return str(root)


def test_a_text_file_is_read_as_its_paragraphs(tmp_path):
  path = tmp_path / 'novel.txt'
  path.write_bytes(TEXT)
  assert text_bytes.read_corpus(str(path)) == PARAGRAPHS
  assert text_bytes.fingerprint(str(path)) == hashlib.sha256(TEXT).hexdigest()  # sha256sum's


def test_a_folder_is_every_text_file_in_it_in_sorted_order(tmp_path):
  folder = write_tree(tmp_path / 'texts')
  assert text_bytes.read_corpus(folder) == [
    b'First by name.',
    b'Inside a subfolder.',
    b'Last by name.',
  ]
  lines = ''.join(
    f'{hashlib.sha256(d).hexdigest()}  {name}\n'
    for d, name in [
      (b'First by name.', 'a.txt'),
      (b'Inside a subfolder.', 'b_sub/inner.md'),
      (b'Last by name.', 'c.rst'),
    ]
  )
  assert text_bytes.fingerprint(folder) == hashlib.sha256(lines.encode()).hexdigest()


def test_python_docs_ship_with_python_and_an_unknown_builtin_is_refused():
  docs = text_bytes.read_corpus(text_bytes.BUILTIN)
  assert len(docs) > 1000 and all(docs)  # enough to hold out the default 500
  assert any(b'assert' in d for d in docs)
  assert (
    text_bytes.fingerprint(text_bytes.BUILTIN)
    == hashlib.sha256(text_bytes.python_docs()).hexdigest()
  )
  with pytest.raises(ValueError) as e:
    text_bytes.read_corpus('builtin:shakespeare')
  assert str(e.value) == (
    "text corpus 'builtin:shakespeare' is not valid; valid built-in corpora: builtin:python_docs"
  )


@pytest.mark.parametrize(
  'name,content,message',
  [
    ('scan.bin', BINARY, 'not a text file (a NUL byte in its first 8 KiB)'),
    ('one_paragraph.txt', b'only one paragraph', '1 non-empty documents cannot hold out'),
  ],
)
def test_a_file_that_cannot_be_a_corpus_is_one_line_naming_it(
  tmp_path, cache, name, content, message
):
  path = tmp_path / name
  path.write_bytes(content)
  config = main_runner.parsed_config(
    'configs/bytelm.py:softmax,d_model=16,num_heads=2,depth=1,seq_len=16,validation_docs=1,'
    f'batch_size=2,packing={packs("softmax")}',
    f'--config.dataset.corpus={path}',
  )
  with pytest.raises(validate.ConfigError) as e:
    validate.resolved(config)
  assert str(e.value).startswith(str(path)) and message in str(e.value), e.value
  assert '\n' not in str(e.value)


@pytest.mark.skipif(
  not packs('softmax'), reason='the default config packs, and softmax keeps no packed rows yet'
)
def test_the_default_config_runs_from_a_fresh_clone(monkeypatch, tmp_path, cache):
  """No flag: the default corpus ships with Python (nothing beside the checkout, as
  ../shared/data is beside this project's own), and its windows go to the cache."""
  clone = tmp_path / 'elsewhere'
  clone.mkdir()
  monkeypatch.chdir(clone)  # '../shared/data/...' would not resolve here
  config = main_runner.parsed_config('configs/bytelm.py')
  resolved = validate.resolved(config)
  assert config.dataset.corpus == text_bytes.BUILTIN
  assert resolved.dataset.corpus_sha256 == text_bytes.fingerprint(text_bytes.BUILTIN)
  assert sorted(os.listdir(cache / 'text_bytes'))  # the windows, written once
  assert not os.listdir(clone)


def test_a_folder_corpus_with_its_splits_through_the_flag(tmp_path, cache):
  folder = tmp_path / 'texts'
  write_tree(folder)
  for i in range(4):
    (folder / f'd{i}.txt').write_bytes(f'Document {i}. '.encode() * (i + 2))
  config = main_runner.parsed_config(
    'configs/bytelm.py:softmax,d_model=16,num_heads=2,depth=1,seq_len=16,validation_docs=2,'
    f'batch_size=2,packing={packs("softmax")}',
    f'--config.dataset.corpus={folder}',
  )
  resolved = validate.resolved(config)
  assert resolved.dataset.corpus_sha256 == text_bytes.fingerprint(str(folder))
  held = arrays.get_split(resolved, 'validation')
  train = arrays.get_split(resolved, 'train')
  scored = lambda split: bytes(split.labels[split.labels >= 0].astype(np.uint8).tolist())
  assert len(scored(held)) + len(scored(train)) == sum(
    len(d) for d in text_bytes.read_corpus(str(folder))
  )


# A bucket: the corpus through data/files.py (TF's ram:// file system stands for gs://,
# as in the other data tests), the samples through epath (fake_gcs's gs://).


def test_a_corpus_and_its_cache_in_a_bucket(tmp_path):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  bucket = f'ram://{tmp_path.name}'
  for name, content in [
    ('texts/a.txt', b'First.'),
    ('texts/sub/b.txt', b'Second one.'),
    ('texts/c.txt', b'Third, last.'),
    ('texts/logo.png', BINARY),
    ('novel.txt', TEXT),
  ]:
    tf.io.gfile.makedirs(os.path.dirname(f'{bucket}/{name}'))
    with tf.io.gfile.GFile(f'{bucket}/{name}', 'wb') as f:
      f.write(content)
  assert text_bytes.read_corpus(f'{bucket}/texts') == [
    b'First.',
    b'Third, last.',
    b'Second one.',
  ]  # a, c, sub/b
  assert text_bytes.read_corpus(f'{bucket}/novel.txt') == PARAGRAPHS
  assert text_bytes.fingerprint(f'{bucket}/novel.txt') == hashlib.sha256(TEXT).hexdigest()
  paths = text_bytes.write_splits(
    f'{bucket}/cache', f'{bucket}/texts', seq_len=8, validation_docs=1, verbose=False
  )
  assert all(p.startswith(f'{bucket}/cache/') and tf.io.gfile.exists(p) for p in paths)
  assert not os.path.exists('ram:')


def test_the_samples_are_written_into_a_bucket_workdir(monkeypatch, tmp_path):
  cwd = tmp_path / 'cwd'
  cwd.mkdir()
  monkeypatch.chdir(cwd)
  samples = [dict(prompt='The', continuation=' end')]
  with fake_gcs.installed(monkeypatch, tmp_path / 'bucket') as local:
    paths = byte_lm.write_samples('gs://bucket/run', dict(temperature=0.8), samples)
    assert paths == {
      'samples': 'gs://bucket/run/samples.json',
      'samples_text': 'gs://bucket/run/samples.txt',
    }
    run = local('gs://bucket/run')
    assert json.loads((run / 'samples.json').read_text())['samples'] == samples
    assert (run / 'samples.txt').read_text() == '--- sample 0 (temperature 0.8) ---\nThe[[ end]]\n'
  assert not os.listdir(cwd)


# The corpus's fingerprint in the run's identity


def test_the_fingerprint_is_compared_only_where_both_configs_have_it():
  stored = {'dataset': {'corpus': 'c.txt', 'corpus_sha256': 'aa'}}
  assert workdir_lib.differences(stored, {'dataset': {'corpus': 'c.txt'}}) == []  # no data read
  assert (
    workdir_lib.differences(
      {'dataset': {'corpus': 'c.txt'}},
      {  # stored before it was
        'dataset': {'corpus': 'c.txt', 'corpus_sha256': 'bb'}
      },
    )
    == []
  )
  assert workdir_lib.differences(
    stored, {'dataset': {'corpus': 'c.txt', 'corpus_sha256': 'bb'}}
  ) == [
    "dataset.corpus_sha256: 'aa' -> 'bb' (the text of "
    "dataset.corpus changed; builtin:python_docs is the "
    "running Python's documentation and changes with its "
    "version)"
  ]


def _tiny(corpus, num_steps):
  return main_runner.parsed_config(
    f'configs/bytelm.py:linear,d_model=16,num_heads=2,depth=1,seq_len=16,validation_docs=1,'
    f'batch_size=2,num_steps={num_steps},packing={packs("linear")}',
    f'--config.dataset.corpus={corpus}',
    '--config.train.checkpoint_every=2',
    '--config.sample.num_samples=1',
  )


def _quiet(fn, *args):
  with contextlib.redirect_stdout(io.StringIO()):
    return fn(*args)


@pytest.mark.slow
def test_a_resume_on_edited_text_is_refused_in_one_line(tmp_path, cache):
  corpus = tmp_path / 'texts'
  corpus.mkdir()
  for i, paragraph in enumerate(PARAGRAPHS):
    (corpus / f'{i}.txt').write_bytes(paragraph * 3)
  workdir = str(tmp_path / 'run')
  first = _quiet(trainer.train_and_evaluate, _tiny(corpus, 2), workdir)
  assert first['steps'] == 2
  before = sorted(os.listdir(workdir))

  (corpus / '1.txt').write_bytes(PARAGRAPHS[1] * 3 + b' A sentence added between the runs.')
  for action in (
    lambda: trainer.train_and_evaluate(_tiny(corpus, 4), workdir),
    lambda: trainer.evaluate(_tiny(corpus, 2), workdir),
  ):  # --mode=eval too
    with pytest.raises(workdir_lib.WorkdirError) as e:
      _quiet(action)
    assert (
      'dataset.corpus_sha256: ' in str(e.value)
      and '(the text of dataset.corpus changed; ' in str(e.value)
      and '\n' not in str(e.value)
    ), e.value
  assert sorted(os.listdir(workdir)) == before
  stored = workdir_lib.load_config(workdir)
  assert stored.dataset.corpus_sha256 != text_bytes.fingerprint(str(corpus))

  (corpus / '1.txt').write_bytes(PARAGRAPHS[1] * 3)  # the same text again: the run resumes
  assert stored.dataset.corpus_sha256 == text_bytes.fingerprint(str(corpus))
  assert _quiet(trainer.train_and_evaluate, _tiny(corpus, 4), workdir)['steps'] == 4


@pytest.mark.slow
def test_a_tiny_run_on_the_default_corpus(monkeypatch, tmp_path, cache):
  """`python main.py --config=configs/bytelm.py` at tiny sizes, from outside the checkout."""
  monkeypatch.chdir(tmp_path)
  config = main_runner.parsed_config(
    'configs/bytelm.py:gla,d_model=16,num_heads=2,depth=1,seq_len=32,batch_size=4,num_steps=2,'
    f'packing={packs("gla")}'
  )
  workdir = str(tmp_path / 'run')
  results = _quiet(trainer.train_and_evaluate, config, workdir)
  assert results['steps'] == 2 and np.isfinite(results['eval_bits_per_byte'])
  stored = workdir_lib.load_config(workdir)
  assert stored.dataset.corpus == text_bytes.BUILTIN
  assert stored.dataset.corpus_sha256 == text_bytes.fingerprint(text_bytes.BUILTIN)
  samples = json.loads((tmp_path / 'run' / 'samples.json').read_text())['samples']
  assert len(samples) == 2 and all(s['continuation'] for s in samples)
