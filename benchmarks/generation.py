r"""Image generation speed: linear attention as an RNN vs softmax with a KV cache.

Reproduces the table of the "Efficient Attention" report (section 1.2): wall
time to generate 100, 200, 300 images of 28 x 28 = 784 pixels with a causal
pixel Transformer, linear attention (recurrent form: constant-size state per
layer) against softmax attention (key/value cache; each step attends over the
cached prefix, so it costs O(position)). Both are measured in one run, with
the same weights (the two mechanisms have the same parameters; a mechanism with
parameters of its own, such as a gated one's gate projections, draws its own
from the same seed), by:

  * wall time: the jit-compiled sampler (`train.sampling.sample_fn`) for
    each batch size, compiled ahead of time (compile time reported
    separately), median of --repeats calls;
  * per-step latency against position: the jit-compiled single step called
    from Python at every position (batch --latency_batch), each call followed
    by block_until_ready, so the curve shows how a step's cost grows with t.

    python -m benchmarks.generation --out=benchmark_results/generation
    python -m benchmarks.generation --num_images=10,20 --image_size=8 --depth=1
    python -m benchmarks.generation --params=pixel_lm.msgpack --d_model=256 ...

Weights are random unless --params names a flax msgpack file of the model's
params (`flax.serialization.to_bytes`; the architecture flags must match it)
or --workdir a trainer run of the 'pixel_lm' task (e.g. configs/digits_pixels.py),
whose newest checkpoint gives the weights and the architecture (image size,
widths, depth; LoRA adapters merged), every mechanism reusing them:

    python -m benchmarks.generation --workdir=runs/digits_pixels --num_images=100
Writes <out>/<name>.json, <out>/<name>.md, <out>/<name>_latency.png (per-step
latency against position) and <out>/<name>_wall.png (wall time against images).
"""

import functools
import time
from typing import Any, Dict, Optional, Sequence

from absl import flags
import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import attention_bench
from benchmarks import common
from benchmarks import machine
from benchmarks import output
from benchmarks import timing
from efficient_attn.layers import cache as cache_lib
from efficient_attn.models import CausalTransformer
from efficient_attn.models import TransformerConfig
from efficient_attn.models import sampling


def define_flags(fv: flags.FlagValues) -> None:
  common.define_output_flags(fv, out='benchmark_results/generation', name='generation')
  flags.DEFINE_string('mechanisms', 'linear,softmax', 'comma list (decodable)', flag_values=fv)
  flags.DEFINE_string('num_images', '100,200,300', 'comma list of batch sizes', flag_values=fv)
  flags.DEFINE_integer('image_size', 28, 'side; length = side^2', flag_values=fv)
  flags.DEFINE_integer('d_model', 64, 'model width', flag_values=fv)
  flags.DEFINE_integer('depth', 2, 'number of layers', flag_values=fv)
  flags.DEFINE_integer('num_heads', 4, 'attention heads', flag_values=fv)
  flags.DEFINE_string(
    'num_kv_heads',
    '0',
    'comma list of key/value head counts '
    '(grouped-query attention; 0: one per head); each is a model',
    flag_values=fv,
  )
  flags.DEFINE_integer('mlp_dim', 128, 'MLP hidden width', flag_values=fv)
  flags.DEFINE_multi_string(
    'option', [], 'mechanism option, e.g. linear.feature_map=relu (repeatable)', flag_values=fv
  )
  flags.DEFINE_integer(
    'latency_batch',
    0,
    'batch of the per-step latency run (0: the first --num_images)',
    flag_values=fv,
  )
  flags.DEFINE_integer('repeats', 1, 'timed sampler calls per point', lower_bound=1, flag_values=fv)
  flags.DEFINE_float('temperature', 1.0, 'sampling temperature', flag_values=fv)
  flags.DEFINE_string('params', '', 'flax msgpack file of trained params', flag_values=fv)
  flags.DEFINE_string(
    'workdir',
    '',
    'trainer workdir of a pixel_lm run: weights '
    'and architecture from its checkpoint (overrides the architecture flags)',
    flag_values=fv,
  )
  flags.DEFINE_integer('seed', 0, 'random seed', flag_values=fv)


def build_model(
  args, mechanism: str, options: Dict[str, Any], num_kv_heads: int = 0
) -> CausalTransformer:
  return CausalTransformer(
    TransformerConfig(
      max_length=args.image_size**2,
      d_model=args.d_model,
      depth=args.depth,
      num_heads=args.num_heads,
      num_kv_heads=num_kv_heads or None,
      mlp_dim=args.mlp_dim,
      mechanism=mechanism,
      options=options.get(mechanism) or None,
    )
  )


def cache_bytes(model, params) -> int:
  """Bytes of the decoding cache of one sequence (every layer; keys and values, or
  the recurrent state, and the position). The packed-rows bookkeeping (each cached key's
  document, each row's document counters: `cache_lib.DOCUMENT_NAMES`) is left out: it is
  the same for every mechanism of a kind, and only packed decoding reads it."""
  decoder = model.clone(decode=True)
  shapes = jax.eval_shape(lambda p: sampling.init_cache(decoder, p, 1, model.max_length), params)
  leaves = jax.tree_util.tree_leaves_with_path(shapes)
  return int(
    sum(
      x.size * x.dtype.itemsize
      for path, x in leaves
      if not any(getattr(key, 'key', None) in cache_lib.DOCUMENT_NAMES for key in path)
    )
  )


def load_params(model: CausalTransformer, path: str, seed: int):
  """Random params from `seed`, or those in the msgpack file `path` (same structure)."""
  params = jax.jit(model.init)(
    jax.random.PRNGKey(seed), jnp.zeros((1, model.max_length), jnp.int32)
  )['params']
  if path:
    with open(path, 'rb') as f:
      params = flax.serialization.from_bytes(params, f.read())
  return params


def load_workdir(args):
  """(model, params) of a trained pixel_lm run; sets args' architecture fields from it."""
  from train import api  # pylint: disable=g-import-not-at-top

  config, model, params = api.load(args.workdir, merged=True)
  if not isinstance(model, CausalTransformer):
    raise ValueError(
      f'--workdir={args.workdir!r} holds a {config.model.kind!r} model; '
      f"generation needs a 'causal' one (task 'pixel_lm')"
    )
  args.image_size = config.dataset.image_size
  c = model.config
  args.d_model, args.depth, args.num_heads, args.mlp_dim = (
    c.d_model,
    c.depth,
    c.num_heads,
    c.mlp_dim,
  )
  return model, params


def time_sampler(model, params, batch: int, args) -> Dict[str, Any]:
  """AOT-compile, then time generating `batch` images (median of args.repeats)."""
  length = model.max_length
  run = sampling.sample_fn(model, batch, length)
  rng = jax.random.PRNGKey(args.seed)
  rest = sampling.sampler_args(batch, length, args.temperature)
  start = time.perf_counter()
  compiled = run.lower(params, rng, *rest).compile()
  compile_s = time.perf_counter() - start
  times = []
  for i in range(max(1, args.repeats)):
    start = time.perf_counter()
    timing.block(compiled(params, jax.random.fold_in(rng, i), *rest))
    times.append(time.perf_counter() - start)
  return dict(time_s=float(np.median(times)), times_s=times, compile_s=compile_s)


def step_latency(model, params, batch: int, args) -> np.ndarray:
  """Seconds of each single-token step at positions 0..length-1 (batch `batch`)."""
  length = model.max_length
  step = sampling.make_step(model)

  @functools.partial(jax.jit, donate_argnums=(1,))  # update the cache in place
  def sample_step(params, cache, token, rng):
    logits, cache = step(params, cache, token)
    return sampling.sample_logits(rng, logits, args.temperature), cache

  decoder = model.clone(decode=True)
  cache = jax.jit(lambda p: sampling.init_cache(decoder, p, batch, length))(params)
  token = jnp.full((batch,), model.start_token, jnp.int32)
  rng = jax.random.PRNGKey(args.seed)
  for _ in range(3):  # compile and warm up on a copy (donated, then discarded)
    timing.block(sample_step(params, jax.tree.map(jnp.copy, cache), token, rng))
  times = np.zeros(length)
  for t in range(length):
    start = time.perf_counter()
    token, cache = timing.block(sample_step(params, cache, token, jax.random.fold_in(rng, t)))
    times[t] = time.perf_counter() - start
  return times


def smooth(x: np.ndarray, window: int) -> np.ndarray:
  """Running median over `window` positions (robust to scheduler noise)."""
  half = window // 2
  return np.array([np.median(x[max(0, i - half) : i + half + 1]) for i in range(len(x))])


def markdown(result: Dict[str, Any]) -> str:
  mechs = result['mechanisms']
  cfg = result['config']
  source = cfg.get('workdir') or cfg['params']
  notes = [
    f"model: d_model={cfg['d_model']}, depth={cfg['depth']}, heads={cfg['num_heads']}, "
    f"mlp={cfg['mlp_dim']}, {result['num_params']:,} params, "
    f"{'weights from ' + source if source else 'random weights'}",
    f"images of {cfg['image_size']}x{cfg['image_size']} = {result['length']} pixels "
    f"(steps), temperature {cfg['temperature']}",
    'linear: recurrent state per layer; softmax: key/value cache, each step '
    'visits only the filled cache blocks; local: a ring buffer of its window',
    'times exclude compilation (reported in the JSON)',
  ]
  text = output.header(
    'Image generation: linear (RNN) vs softmax (KV cache)',
    machine.describe_device(result['device']),
    notes,
  )
  ref = mechs[0]
  headers = ['images'] + [f'{m} (s)' for m in mechs] + [f'{m} / {ref}' for m in mechs[1:]]
  rows = []
  for n in result['num_images']:
    t = [result['wall'][m][str(n)]['time_s'] for m in mechs]
    rows.append([n] + [f'{x:.3f}' for x in t] + [f'{x / t[0]:.2f}x' for x in t[1:]])
  text += '\n## Wall time to generate the images\n\n' + output.table(headers, rows) + '\n'
  lat_rows = []
  for m in mechs:
    lat = np.asarray(result['latency'][m]['times_s'])
    k = max(1, len(lat) // 10)
    lat_rows.append(
      [
        m,
        output.fmt_time(float(np.median(lat[:k]))),
        output.fmt_time(float(np.median(lat[-k:]))),
        f'{np.median(lat[-k:]) / np.median(lat[:k]):.2f}x',
      ]
    )
  kv_rows = [
    [
      m,
      f"{result['params'][m]:,}",
      f"{result['cache_bytes'][m] / 1024:.1f}",
      f"{result['cache_bytes'][m] / result['cache_bytes'][m.split(' ')[0]]:.2f}x"
      if m.split(' ')[0] in result['cache_bytes']
      else '',
    ]
    for m in mechs
  ]
  text += (
    '\n## Decoding state per image (every layer)\n\n'
    'Key/value cache (softmax; local: its window only) or recurrent state (linear, '
    'rfa, performer) of one sequence at full length; with grouped-query attention keys '
    'and values have fewer heads, and so does a state that depends on them alone.\n\n'
    + output.table(['model', 'params', 'state KiB', 'vs. one kv head per head'], kv_rows)
    + '\n'
  )
  text += (
    f"\n## Per-step latency (batch {result['latency_batch']}), median over the "
    f"first / last 10% of positions\n\n"
    + output.table(['mechanism', 'first 10%', 'last 10%', 'last / first'], lat_rows)
    + '\n'
  )
  return text


def run(args) -> Dict[str, Any]:
  kinds = common.csv_list(args.mechanisms)
  kv_heads = common.csv_list(args.num_kv_heads, int)
  variants = [
    (m if kv in (0, args.num_heads) else f'{m} (kv heads {kv})', m, kv)
    for m in kinds
    for kv in kv_heads
  ]  # (label, mechanism, kv heads)
  mechs = [label for label, _, _ in variants]
  sizes = common.csv_list(args.num_images, int)
  options = common.parse_options(args.option)
  latency_batch = args.latency_batch or sizes[0]
  trained, params = load_workdir(args) if args.workdir else (None, None)  # sets the sizes
  result: Dict[str, Any] = dict(
    config=args.flag_values_dict(),
    device=machine.device_info(),
    mechanisms=mechs,
    num_images=sizes,
    length=args.image_size**2,
    latency_batch=latency_batch,
    wall={},
    latency={},
    cache_bytes={},
  )
  if trained is not None and kv_heads != [0]:
    raise ValueError(
      f'--num_kv_heads={args.num_kv_heads}: a trained --workdir fixes the '
      f'key/value heads; leave it 0'
    )
  weights = {}  # one set of weights per parameter structure, shared by the mechanisms
  for label, mech, kv in variants:
    if trained is not None:  # the trained model with this mechanism
      c = trained.config
      own = dict(c.options or {}) if mech == c.mechanism else {}
      model = trained.clone(
        config=c.replace(mechanism=mech, options={**own, **options.get(mech, {})} or None)
      )
    else:
      model = build_model(args, mech, options, kv)
    if trained is None:
      # Mechanisms with parameters of their own (e.g. the gated ones' gate projections)
      # draw their own weights from the same seed; the others share one set.
      shapes = jax.eval_shape(
        model.init, jax.random.PRNGKey(0), jnp.zeros((1, model.max_length), jnp.int32)
      )['params']
      structure = (kv, jax.tree.structure(shapes), tuple(s.shape for s in jax.tree.leaves(shapes)))
      if structure not in weights:
        weights[structure] = load_params(model, args.params if not kv else '', args.seed)
      params = weights[structure]
    result.setdefault('num_params', attention_bench.count_params(params))
    result.setdefault('params', {})[label] = attention_bench.count_params(params)
    result['cache_bytes'][label] = cache_bytes(model, params)
    result['wall'][label] = {}
    for n in sizes:
      result['wall'][label][str(n)] = time_sampler(model, params, n, args)
      if not args.quiet:
        print(f"{label}: {n} images in {result['wall'][label][str(n)]['time_s']:.3f} s", flush=True)
    result['latency'][label] = dict(times_s=step_latency(model, params, latency_batch, args))
  return result


def plot(path: str, result: Dict[str, Any]) -> str:
  positions = np.arange(result['length'])
  window = max(1, result['length'] // 50)
  latency = {
    m: (positions, smooth(np.asarray(result['latency'][m]['times_s']), window) * 1e3)
    for m in result['mechanisms']
  }
  wall = {
    m: (result['num_images'], [result['wall'][m][str(n)]['time_s'] for n in result['num_images']])
    for m in result['mechanisms']
  }
  output.line_plot(
    path,
    [(f"per-step latency (batch {result['latency_batch']}, running median of {window})", latency)],
    xlabel='position (pixel)',
    ylabel='ms per step',
    logx=False,
    logy=False,
    suptitle=machine.describe_device(result['device']),
  )
  output.line_plot(
    path.replace('_latency.png', '_wall.png'),
    [('wall time to generate', wall)],
    xlabel='images',
    ylabel='seconds',
    logx=False,
    logy=False,
  )
  return path


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  args = common.parse_flags(define_flags, argv, __doc__)
  result = run(args)
  plot(f'{args.out}/{args.name}_latency.png', result)
  output.finish(args.out, args.name, result, markdown(result), quiet=args.quiet)
  return result


if __name__ == '__main__':
  main()
