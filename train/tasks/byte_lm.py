"""The 'byte_lm' task: a byte-level language model (`data/text_bytes.py` windows).

Sequence labelling with every byte scored (`sequence_labelling.py`: the causal
model, its vocabulary head at the scored positions, cross-entropy), plus
'bits_per_byte' (cross-entropy in nats / ln 2, per scored byte). Packed rows
(`dataset.packing`) are read with their segment ids (`sequence_labelling.logits_at`),
so each byte is scored in the context of its own window, as unpacked; 'tokens' (the
trainer's tok/s) counts the real bytes, every one of which is scored.

After training, and in `--mode=eval`, `write_outputs` continues the first
`sample.num_samples` held-out documents of the evaluation split: the start token and
their first `sample.prompt_bytes` bytes are the prompt, prefilled, and
`sample.new_bytes` bytes are sampled after it (`efficient_attn.models.generate`, at
`sample.temperature`). It writes `samples.json` (prompt, continuation and the settings)
and `samples.txt` (the same, readable).
"""

import json
import math
import os
from typing import Dict, List

from etils import epath
import jax
import numpy as np

from data import arrays
from data import packing
from data import text_bytes
from efficient_attn.models import generate
from train import adapters
from train.tasks import base
from train.tasks import sequence_labelling

SAMPLE_DEFAULTS = dict(num_samples=2, prompt_bytes=64, new_bytes=128, temperature=0.8, seed=0)


def loss_and_metrics(model, params, batch, *, train: bool, rngs=None):
  """`sequence_labelling.loss_and_metrics` with 'bits_per_byte' (sum of bits; / 'count');
  'tokens' is 'count' (every real byte is scored)."""
  loss, metrics = sequence_labelling.loss_and_metrics(model, params, batch, train=train, rngs=rngs)
  return loss, dict(metrics, bits_per_byte=metrics['loss'] / math.log(2.0), tokens=metrics['count'])


def _first_windows(split):
  """(row, start, end) of each document's first window in `split` (the windows that read
  START first): whole rows, or, packed, the segments that begin with START."""
  if split.segment_ids is None:
    rows = np.flatnonzero(split.inputs[:, 0] == text_bytes.START)
    return [(int(r), 0, split.inputs.shape[1]) for r in rows]
  return [
    (r, a, b)
    for r, a, b in packing.spans(split.segment_ids)
    if split.inputs[r, a] == text_bytes.START
  ]


def prompts(config, num: int, length: int) -> np.ndarray:
  """uint8-valued int32 `[num, length]`: the first `length` bytes of the first `num`
  documents of the evaluation split (in the order of its rows) whose first window holds
  that many (fewer rows if there are fewer)."""
  split = arrays.get_split(config, config.dataset.eval_split)
  found = [
    split.labels[r, a : a + length]
    for r, a, b in _first_windows(split)
    if b - a >= length and (split.labels[r, a : a + length] >= 0).all()
  ][:num]
  return np.asarray(found, np.int32).reshape(len(found), length)


def continue_bytes(
  model, params, rng, prompt: np.ndarray, new_bytes: int, temperature: float
) -> np.ndarray:
  """int32 `[b, new_bytes]`: bytes sampled after `prompt` `[b, p]` (byte values), a
  document's first bytes: the model reads the start token before them."""
  start = np.full((len(prompt), 1), text_bytes.START, np.int32)
  out = generate.generate(
    model,
    params,
    np.concatenate([start, prompt], axis=1),
    new_bytes,
    temperature=temperature,
    rng=rng,
  )
  return np.asarray(out.tokens)


def text(values) -> str:
  """Bytes as text (UTF-8, invalid sequences replaced)."""
  return bytes(np.asarray(values, np.uint8).tolist()).decode('utf-8', errors='replace')


def write_outputs(config, model, params, workdir: str) -> Dict[str, str]:
  """`samples.json` and `samples.txt` in `workdir`: continued held-out prompts."""
  settings = {**SAMPLE_DEFAULTS, **(config.get('sample') or {})}
  if settings['num_samples'] <= 0:
    return {}
  model, params = adapters.unwrap(config, model, jax.device_get(params))
  prompt = prompts(config, settings['num_samples'], settings['prompt_bytes'])
  if not len(prompt):
    return {}
  continuations = continue_bytes(
    model,
    params,
    jax.random.key(settings['seed']),
    prompt,
    settings['new_bytes'],
    settings['temperature'],
  )
  samples = [
    dict(prompt=text(start), continuation=text(rest)) for start, rest in zip(prompt, continuations)
  ]
  return write_samples(workdir, settings, samples)


def write_samples(workdir: str, settings: Dict, samples: List[Dict[str, str]]) -> Dict[str, str]:
  """`samples.json` ({settings, samples}) and `samples.txt` (readable) in `workdir`, a
  local folder or a bucket (through `etils.epath`, as the workdir's other files); returns
  their paths. `samples`: [{prompt, continuation}]."""
  folder = epath.Path(workdir)
  folder.mkdir(parents=True, exist_ok=True)
  paths = {'samples': folder / 'samples.json', 'samples_text': folder / 'samples.txt'}
  paths['samples'].write_text(json.dumps(dict(settings=settings, samples=samples), indent=1))
  paths['samples_text'].write_text(
    ''.join(
      f'--- sample {i} (temperature {settings["temperature"]}) ---\n{sample["prompt"]}'
      f'[[{sample["continuation"]}]]\n'
      for i, sample in enumerate(samples)
    )
  )
  return {k: os.fspath(v) for k, v in paths.items()}


TASK = base.Task(
  name='byte_lm',
  loss_and_metrics=loss_and_metrics,
  write_outputs=write_outputs,
  reads=('sequence',),
)
