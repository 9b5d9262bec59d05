"""The base config: every field with its default (big_vision style), and the helpers the
experiment files share (the attention group, their argument string, LRA's model).

A config file builds its `ConfigDict` from `base()` and the dataset and task presets
(`configs/presets.py`), then sets only what its experiment changes:

    def get_config():
      config = common.base()
      presets.cifar10(config)
      config.model.d_model = 128
      return config

Groups (the contract other tools rely on):
  dataset    name, source, data_dir, batch_size (global), eval_batch_size,
             image_size or max_length, num_classes, shuffle_buffer, augment,
             splits, holdout, mean / std, pixels_as_tokens (images as int tokens
             0..255 `[b, h*w]`: the causal pixel model, LRA's Image and Pathfinder), transform (a
             `data.transforms` variant, e.g. 'rotated', applied to
             train and eval images; '' = none); sequence datasets (mqar, sequences):
             vocab_size. See `data/specs.py`.
  model      kind ('vit' | 'text' | 'causal' | 'mlp'), d_model, depth, num_heads,
             mlp_dim, patch_size, pool, dropout_rate, attention_dropout_rate,
             max_length, reversible, positions (text: 'learned' | 'sinusoidal'),
             interaction (text pairs: 'concat' | 'nli').
  attention  mechanism (a name, or names joined by '+' that the blocks take in turn:
             'linear+local', see efficient_attn.layers.hybrid), projection, options (a ConfigDict of
             mechanism options), rotary, num_kv_heads.
  optim      name, learning_rate, warmup_steps, weight_decay, grad_clip, b1, b2.
  train      num_steps or num_epochs (num_steps > 0 takes precedence), eval_every, log_every,
             checkpoint_every, keep_checkpoints, async_checkpoints, seed, dtype, mesh
             ({'data': -1, 'fsdp': 1, 'sequence': 1}: see train/mesh.py), fsdp_min_size.
  task ('classification' | 'pixel_lm' | 'sequence_labelling' | 'byte_lm'), init_from, lora
             (rank=0: off; alpha, targets: see `train/adapters.py`), sample (pixel_lm: the
             sample / completion PNGs, see `presets.pixel_lm`; byte_lm: the held-out
             continuations, see `presets.text_bytes`).
Fields a sweep varies are plain values, so `--config.attention.mechanism=linear`
works. No field defaults to None: overrides from the command line need a type.
"""

from typing import Any, Dict, Optional

import ml_collections

from configs import presets
from efficient_attn import registry
from efficient_attn.layers import hybrid


def attention_options() -> ml_collections.ConfigDict:
  """Every option of every mechanism as a typed field, None = the mechanism's default.

  So `--config.attention.mechanism=nystrom --config.attention.options.num_landmarks=8`
  works on any config; an option set for a mechanism that does not have it is
  an error naming the mechanism's options. The defaults themselves live in
  each mechanism's declaration (`efficient_attn.get_mechanism(name).options`).
  """
  return ml_collections.ConfigDict(
    {
      name: ml_collections.FieldReference(None, field_type=opt.type)
      for name, opt in sorted(registry.option_table().items())
    }
  )


def base() -> ml_collections.ConfigDict:
  """Every field with its default; the experiment files override a few."""
  config = ml_collections.ConfigDict()
  config.task = 'classification'
  config.init_from = ''  # a workdir whose latest checkpoint's params initialise this run

  config.dataset = ml_collections.ConfigDict(
    dict(
      name='digits',  # what the data is: digits, mnist, cifar10, cifar100, imagenet2012,
      # imdb_reviews, image_folder
      source='',  # where it is read from: tfds, arrays (.npz), folder, sklearn,
      # generated; '' = the dataset's own (digits: sklearn, ...: tfds)
      data_dir='',  # tfds: the TFDS data dir ('' = TFDS default); arrays: the .npz
      # file ('{split}' in it: one file per split); folder: the root
      manual_dir='',  # TFDS manual download dir (imagenet2012)
      download=True,  # let TFDS download and prepare a missing dataset
      train_split='train',
      eval_split='test',
      holdout=0.0,  # > 0: that fraction of train becomes split 'validation'
      # (fixed, class-stratified; in-memory datasets)
      batch_size=64,  # global, over all devices and hosts
      eval_batch_size=256,  # global
      image_size=0,  # square side the images are resized to (image datasets)
      channels=0,
      max_length=0,  # token length (text datasets)
      num_classes=0,  # 0: from the dataset (ImageFolder: number of label folders)
      shuffle_buffer=10_000,
      augment='none',  # 'none' | 'crop' | 'crop_flip' | 'inception_crop' (streamed only)
      mean=(),  # per-channel image normalisation in [0, 1] units; () = the
      std=(),  # dataset's preset, or measured on the training images
      pixels_as_tokens=False,  # images -> int32 tokens 0..255 `[b, h*w]`, no resize/normalise
      transform='',  # 'rotated' | 'inverted' | 'quantised' | a transforms spec; '' = none
    )
  )
  config.model = ml_collections.ConfigDict(
    dict(
      kind='vit',
      d_model=64,
      depth=2,
      num_heads=4,
      mlp_dim=128,
      patch_size=2,
      pool='cls',  # 'cls' | 'mean'
      positions='learned',  # text models: 'learned' | 'sinusoidal' (fixed; LRA's default)
      dropout_rate=0.0,
      attention_dropout_rate=0.0,
      max_length=0,  # text: context length the model is built for (0: dataset.max_length)
      reversible=False,  # reversible residual blocks: activation memory flat in depth
    )
  )
  config.attention = ml_collections.ConfigDict(
    dict(
      mechanism='softmax',
      projection='standard',
      options=attention_options(),
      rotary=False,  # rotary positions (RoPE) on q, k (kernel mechanisms: RoFormer form)
      num_kv_heads=0,  # grouped-query attention: key/value heads (0: one per head)
    )
  )
  config.optim = ml_collections.ConfigDict(
    dict(
      name='adamw',  # 'adamw' | 'sgd' (b1 is the momentum)
      learning_rate=1e-3,  # peak, after linear warmup; cosine decay to 0 afterwards
      warmup_steps=100,
      weight_decay=1e-4,  # decoupled, on matrices only (ndim > 1)
      grad_clip=1.0,  # global norm; 0 disables
      max_warmup_fraction=0.2,  # warmup_steps is capped at this fraction of the run
      b1=0.9,
      b2=0.999,
    )
  )
  config.train = ml_collections.ConfigDict(
    dict(
      num_steps=-1,
      num_epochs=-1,
      eval_every=-1,  # steps; -1: only at the end
      log_every=50,
      checkpoint_every=1000,
      keep_checkpoints=3,
      async_checkpoints=True,  # Orbax writes in the background; False: the loop waits
      seed=0,
      dtype='float32',  # compute dtype: 'float32' | 'bfloat16' (params stay float32)
      # Device mesh (train/mesh.py): batch rows over data x fsdp, parameters and optimiser
      # state sharded over fsdp, the sequence over 'sequence'; -1: the remaining devices.
      mesh=ml_collections.ConfigDict(dict(data=-1, fsdp=1, sequence=1)),
      fsdp_min_size=2**14,  # leaves with fewer elements stay replicated under fsdp
    )
  )
  config.lora = ml_collections.ConfigDict(
    dict(
      rank=0,  # 0: off; r >= 1: adapters on `targets`, the base frozen
      alpha=0.0,  # adapter scale alpha / r; 0: scale 1
      targets='default',  # ','-joined presets (default, attention, mlp, head, all) / regexes
    )
  )
  return presets.digits(config)  # the default dataset


def set_attention(
  config, mechanism: str = 'softmax', projection: str = 'standard', **options
) -> ml_collections.ConfigDict:
  """Sets the attention group; options left unset take the mechanism's declared defaults."""
  config.attention.mechanism = mechanism
  config.attention.projection = projection
  for name, value in options.items():
    config.attention.options[name] = value
  return config


def check_causal(path: str, mechanism: str) -> None:
  """One line for a mechanism (or one of a pattern's) without the causal form that a causal
  model needs, before anything is built."""
  for decl in hybrid.registered(mechanism):  # the config's validation names any other
    if not decl.causal:
      what = '' if decl.name == mechanism else f' (of {mechanism!r})'
      raise ValueError(
        f'{path}: mechanism {decl.name!r}{what} has no causal form, which the '
        f'causal model needs; valid choices: '
        f'{", ".join(registry.names_where(lambda m: m.causal))}'
      )


def parse_arg(arg: Optional[str], **defaults) -> Dict[str, Any]:
  """Parses a config (or sweep) argument string as big_vision does.

  `parse_arg('nystrom,max_length=4096', mechanism='softmax', max_length=1024)`
  gives {'mechanism': 'nystrom', 'max_length': 4096}: bare values set the keys
  in order (`'rotated,8'` sets the first two); `key=value` pairs, after them,
  set any key; values are converted to the default's type. A key whose default
  is a tuple takes a list: its values run to the next `key=value`
  (`parse_arg('seeds=0,1,epochs=25', seeds=(0,), epochs=15)` gives
  {'seeds': (0, 1), 'epochs': 25}). A key or value that cannot be used raises a
  one-line ValueError naming it and the valid keys.
  """
  result = dict(defaults)
  if not arg:
    return result
  keys = list(defaults)
  where = f'argument {arg!r}: '
  positional, listing, given = 0, None, set()  # listing: the tuple key being read
  for i, item in enumerate(x for x in arg.split(',') if x):
    key, sep, value = item.partition('=')
    if not sep and listing is not None:
      result[listing] += (_convert(where, listing, item, _kind(defaults[listing])),)
      continue
    if not sep:
      if i > positional or i >= len(keys):
        raise ValueError(
          f'config {where}values without a key set the keys in order and must '
          f'come before any key=value; valid keys, in order: {", ".join(keys)}'
        )
      key, value = keys[i], item
      positional += 1
    if key not in defaults:
      raise ValueError(f'config {where}unknown key {key!r}; valid keys: {", ".join(keys)}')
    given.add(key)
    listing = key if isinstance(defaults[key], tuple) else None
    if listing is None:
      result[key] = _convert(where, key, value, type(defaults[key]))
    elif value:
      result[key] = (_convert(where, key, value, _kind(defaults[key])),)
    else:
      result[key] = ()
  empty = [k for k in keys if k in given and isinstance(defaults[k], tuple) and not result[k]]
  if empty:
    raise ValueError(f'config {where}{empty[0]}= names nothing; give one or more values')
  return result


def at_least(minimum: int, **values) -> None:
  """A one-line ValueError naming the first value (or list item) below `minimum`."""
  for key, value in values.items():
    for v in value if isinstance(value, tuple) else (value,):
      if v < minimum:
        raise ValueError(f'{key}={v} is not valid; it must be >= {minimum}')


def _kind(default: tuple) -> type:
  """The type of a tuple default's values (str for an empty tuple)."""
  return type(default[0]) if default else str


def _convert(where: str, key: str, value: str, kind: type) -> Any:
  """`value` as `kind`; a one-line ValueError naming the key otherwise."""
  if kind is bool:
    return value.lower() in ('1', 'true', 'yes')
  try:
    return kind(value)
  except ValueError:
    raise ValueError(f'config {where}{key}={value!r} is not a valid {kind.__name__}') from None


def size_preset(path: str, sizes: Dict[str, Dict[str, Any]], size: str) -> Dict[str, Any]:
  """A copy of `sizes[size]`; a one-line error naming the valid sizes otherwise."""
  if size not in sizes:
    raise ValueError(f'{path}: size={size!r} is not valid; valid choices: {", ".join(sizes)}')
  return dict(sizes[size])


def lra_model(
  config,
  mechanism: str,
  projection: str,
  *,
  d_model: int,
  depth: int,
  num_heads: int,
  mlp_dim: int,
  pool: str,
  dropout_rate: float = 0.1,
  attention_dropout_rate: float = 0.1,
  positions: str = 'sinusoidal',
):
  """The LRA classifier of a task's config: a token Transformer (`model.kind='text'`) with
  the mechanism and projection. LRA's attention dropout applies where there are attention
  weights to drop (mechanisms that form them); the others get 0. Positions are fixed
  sinusoids, LRA's default (`learn_pos_emb=False`) everywhere but its CIFAR-10 Image task."""
  config.model.update(
    dict(
      kind='text',
      d_model=d_model,
      depth=depth,
      num_heads=num_heads,
      mlp_dim=mlp_dim,
      pool=pool,
      dropout_rate=dropout_rate,
      positions=positions,
    )
  )
  set_attention(config, mechanism, projection)
  forms_weights = any(d.forms_weights for d in hybrid.registered(mechanism))
  config.model.attention_dropout_rate = attention_dropout_rate if forms_weights else 0.0
  return config


def fit_blocks(config, length: int):
  """Block and chunk sizes that tile `length` tokens: the largest divisor of `length` up to
  the mechanism's default (64 -> 50 at 2,000 tokens), for block mechanisms (BigBird,
  Reformer, Sinkhorn) that need the length to be a multiple of their block. In a pattern
  ('bigbird+local', see `efficient_attn.layers.hybrid`) the options are one mapping: a fitted size
  goes to every mechanism of the pattern that has the option."""
  for option in (
    option for d in hybrid.registered(config.attention.mechanism) for option in d.options
  ):
    if option.name in BLOCK_OPTIONS and isinstance(option.default, int):
      current = config.attention.options.get(option.name) or option.default
      if length % current:
        config.attention.options[option.name] = max(
          d for d in range(1, current + 1) if length % d == 0
        )
  return config


BLOCK_OPTIONS = ('block_size', 'chunk_size')
