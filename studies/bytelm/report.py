"""The byte-level LM study's report: bits per byte, speed, decoding state, a continuation.

    python studies/bytelm/report.py --root=runs/bytelm --out=studies/bytelm --name=bytelm

Reads every `<root>/bytelm-<mechanism>-seed<seed>` workdir of the sweep
(`sweep.py`): `results.json` (validation bits per byte, steady examples/s,
wall time), `samples.json` (the continuations written after training) and the
newest checkpoint, whose model gives the decoding state: the bytes of the cache
`efficient_attn.models.sampling.init_cache` allocates for one sequence at the
model's context (`benchmarks.generation.cache_bytes`: every layer's keys and
values, or recurrent state, and the position). Writes `<name>.json`,
`<name>.md` and `<name>.png` (bits per byte against decoding state) into
`--out`, with the bits per byte of unigram and bigram byte counts on the same data beside
them. A run without results.json is listed as not finished.

`--root` may also name an earlier report's .json: its runs and count baselines
come back from it, so the report can be written again after its workdirs are
gone; a workdir of a later `--root` replaces the stored run of the same
mechanism and seed:

    python studies/bytelm/report.py --root=studies/bytelm/bytelm.json --out=runs/bytelm_report
"""

import argparse
import glob
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402  pylint: disable=g-import-not-at-top

from benchmarks import runs  # noqa: E402  pylint: disable=g-import-not-at-top
from benchmarks.generation import cache_bytes  # noqa: E402  pylint: disable=g-import-not-at-top
import data  # noqa: E402  pylint: disable=g-import-not-at-top
from studies import hygiene  # noqa: E402  pylint: disable=g-import-not-at-top
from studies.bytelm import sweep as study  # noqa: E402  pylint: disable=g-import-not-at-top
from train import api  # noqa: E402  pylint: disable=g-import-not-at-top

NAME = re.compile(r'bytelm-(?P<mechanism>.+)-seed(?P<seed>\d+)$')


def collect(root: str):
  """One row per workdir of `root`: mechanism, seed, and what it recorded (None until
  finished)."""
  rows = []
  for workdir in sorted(glob.glob(os.path.join(root, 'bytelm-*'))):
    match = NAME.match(os.path.basename(workdir))
    if not match:
      continue
    row = dict(
      mechanism=match['mechanism'], seed=int(match['seed']), workdir=workdir, finished=False
    )
    path = os.path.join(workdir, 'results.json')
    if os.path.exists(path):
      with open(path) as f:
        r = json.load(f)
      row.update(
        finished=True,
        bits_per_byte=r['eval_bits_per_byte'],
        accuracy=r['eval_accuracy'],
        loss=r['eval_loss'],
        steps=r['steps'],
        examples_per_sec=r['steady_examples_per_sec'],
        wall_time_s=r['wall_time_s'],
        params=r['params_total'],
      )
      config, model, params = api.load(workdir)
      row.update(
        decode_state_bytes=cache_bytes(model, params),
        context=model.max_length,
        batch_size=config.dataset.batch_size,
      )
      with open(os.path.join(workdir, 'samples.json')) as f:
        row['samples'] = json.load(f)
    rows.append(row)
  return rows


RUN_FIELDS = ('mechanism', 'seed', 'workdir', 'finished')


def read_report(path: str):
  """(runs, count baselines) of an earlier report's .json; a file that is not one is
  one line naming it."""
  report = runs.read_report(path)
  stored = report.get('runs') if isinstance(report, dict) else None
  if not isinstance(stored, list) or not all(
    isinstance(r, dict) and set(RUN_FIELDS) <= set(r) for r in stored
  ):
    raise SystemExit(
      f'{path}: not a report JSON (it has no "runs" list with {", ".join(RUN_FIELDS)})'
    )
  return stored, report.get('count_baselines')


def gather(roots):
  """(rows, stored count baselines or None) of `roots`, in order: each a folder of
  workdirs or a report .json; a later run of the same (mechanism, seed) replaces an earlier."""
  by_key, baselines = {}, None
  for root in roots:
    if root.endswith('.json'):
      rows, stored = read_report(root)
      baselines = stored or baselines
    else:
      rows = collect(root)
    by_key.update({(r['mechanism'], r['seed']): r for r in rows})
  order = {m: i for i, m in enumerate(study.MECHANISMS)}
  return sorted(
    by_key.values(),
    key=lambda r: (order.get(r['mechanism'], len(order)), r['mechanism'], r['seed']),
  ), baselines


def count_baselines(config):
  """Bits per byte of byte-count models on the same validation bytes, fitted to the
  training windows of `config`'s data: unigram (add-one) and bigram (the byte before, or
  the start token; add-half)."""

  def pairs(split):  # (byte before, byte) of every scored byte of the split
    before, after = [], []
    for batch in data.get_eval_data(config, split).batches():
      position, label = batch['label'][..., 0], batch['label'][..., 1]
      real = (label >= 0) & (batch['mask'][:, None] > 0)
      before.append(np.take_along_axis(batch['inputs'], position, axis=1)[real])
      after.append(label[real])
    return np.concatenate(before).astype(np.int64), np.concatenate(after).astype(np.int64)

  (xt, yt), (xv, yv) = pairs('train'), pairs('validation')
  unigram = np.bincount(yt, minlength=256) + 1.0
  bigram = np.full((257, 256), 0.5)
  np.add.at(bigram, (xt, yt), 1.0)
  return dict(
    unigram=float(-np.log2((unigram / unigram.sum())[yv]).mean()),
    bigram=float(-np.log2((bigram / bigram.sum(1, keepdims=True))[xv, yv]).mean()),
    train_bytes=int(len(yt)),
    validation_bytes=int(len(yv)),
  )


def summary(rows):
  """Per mechanism over its finished seeds: mean and half range of bits per byte, mean
  examples/s, the decoding state."""
  out = {}
  for m in dict.fromkeys(r['mechanism'] for r in rows):
    done = [r for r in rows if r['mechanism'] == m and r['finished']]
    if not done:
      out[m] = dict(seeds=[])
      continue
    bpb, spread = runs.mean_spread([r['bits_per_byte'] for r in done])
    out[m] = dict(
      seeds=[r['seed'] for r in done],
      bits_per_byte=bpb,
      spread=spread,
      examples_per_sec=sum(r['examples_per_sec'] for r in done) / len(done),
      decode_state_bytes=done[0]['decode_state_bytes'],
      params=done[0]['params'],
    )
  return out


def markdown(rows, means, command: str, baselines=None) -> str:
  lines = [
    f'command: `{command}`',
    '',
    '| mechanism | seeds | validation bits/byte (mean ± half range) | next-byte accuracy '
    '| steady examples/s | decoding state (bytes / sequence) | parameters |',
    '|:---|:---|---:|---:|---:|---:|---:|',
  ]
  for m, s in means.items():
    if not s['seeds']:
      lines.append(f'| {m} | not finished | | | | | |')
      continue
    acc = [r['accuracy'] for r in rows if r['mechanism'] == m and r['finished']]
    lines.append(
      f'| {m} | {",".join(map(str, s["seeds"]))} | {s["bits_per_byte"]:.3f} ± '
      f'{s["spread"]:.3f} | {100 * sum(acc) / len(acc):.1f}% | '
      f'{s["examples_per_sec"]:.1f} | {s["decode_state_bytes"]:,} | '
      f'{s["params"]:,} |'
    )
  if baselines:
    lines += [
      '',
      f'Byte-count models on the same {baselines["validation_bytes"]:,} validation '
      f'bytes, fitted to the {baselines["train_bytes"]:,} training bytes: unigram '
      f'{baselines["unigram"]:.3f} bits/byte, bigram (the byte before) '
      f'{baselines["bigram"]:.3f}.',
    ]
  lines += [
    '',
    '| run | bits/byte | accuracy | steady examples/s | wall time |',
    '|:---|---:|---:|---:|---:|',
  ]
  for r in rows:
    name = os.path.basename(r['workdir'])
    if r['finished']:
      lines.append(
        f'| {name} | {r["bits_per_byte"]:.3f} | {100 * r["accuracy"]:.1f}% | '
        f'{r["examples_per_sec"]:.1f} | {r["wall_time_s"]:.0f} s |'
      )
    else:
      lines.append(f'| {name} | not finished | | | |')
  lines += [
    '',
    'Continuations (the first seed of each mechanism, first held-out prompt; the '
    'prompt, then the sampled bytes in [[ ]]):',
    '',
  ]
  for m in means:
    done = [r for r in rows if r['mechanism'] == m and r['finished']]
    if done:
      sample = done[0]['samples']['samples'][0]
      settings = done[0]['samples']['settings']
      text = (sample['prompt'] + '[[' + sample['continuation'] + ']]').replace('\n', ' ')
      lines += [
        f'- **{m}** (seed {done[0]["seed"]}, temperature {settings["temperature"]}): '
        f'`{text.replace("`", chr(39))}`'
      ]
  return '\n'.join(lines) + '\n'


def plot(rows, means, path: str, baselines=None) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, ax = plt.subplots(figsize=(6, 4))
  for m, s in means.items():
    if s['seeds']:
      ax.errorbar(
        s['decode_state_bytes'], s['bits_per_byte'], yerr=s['spread'], fmt='o', capsize=3, label=m
      )
  if baselines:
    ax.axhline(
      baselines['bigram'], color='gray', linestyle='--', linewidth=1, label='bigram byte counts'
    )
  ax.set_xscale('log')
  ax.set_xlabel('decoding state, bytes per sequence (log)')
  ax.set_ylabel('validation bits per byte')
  steps = {r['steps'] for r in rows if r['finished']}
  ax.set_title(f'Byte-level LM on IMDB reviews, {"/".join(map(str, sorted(steps)))} steps each')
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def write_report(roots, out: str, name: str, command: str):
  """Reads `roots` (`gather`), writes `<out>/<name>.{json,md,png}` and returns the .json's
  content. The count baselines are computed again from a run whose workdir is still
  there, else taken from the report .json they came with."""
  rows, baselines = gather(roots)
  if not rows:
    raise SystemExit(f'{", ".join(roots)}: no bytelm-<mechanism>-seed<seed> workdir')
  means = summary(rows)
  fresh = [r for r in rows if r['finished'] and os.path.isdir(r['workdir'])]
  if fresh:
    baselines = count_baselines(api.load(fresh[0]['workdir'])[0])
  report = dict(command=command, summary=means, count_baselines=baselines, runs=rows)
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, f'{name}.json'), 'w') as f:
    json.dump(report, f, indent=1)
  with open(os.path.join(out, f'{name}.md'), 'w') as f:
    f.write(markdown(rows, means, command, baselines))
  if any(s['seeds'] for s in means.values()):
    plot(rows, means, os.path.join(out, f'{name}.png'), baselines)
  return report


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
    '--root',
    required=True,
    action='append',
    help='A folder of bytelm-<mechanism>-seed<seed> workdirs, or an earlier '
    "report's .json; repeat to merge (later ones win).",
  )
  parser.add_argument('--out', required=True)
  parser.add_argument('--name', default='bytelm')
  args = parser.parse_args()
  command = 'python studies/bytelm/report.py ' + ' '.join(map(hygiene.portable, sys.argv[1:]))
  write_report(args.root, args.out, args.name, command)
  with open(os.path.join(args.out, f'{args.name}.md')) as f:
    print(f.read(), end='')


if __name__ == '__main__':
  main()
