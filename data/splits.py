"""What a dataset's splits hold, read from the data: whether they can be read (`prepare`),
their sizes (`num_examples`), classes (`num_classes`) and vocabulary (`vocab_size`).
Each function takes a config or its resolved `specs.Dataset`; `data/__init__.py`
re-exports them."""

from data.specs import resolve


def num_classes(config) -> int:
  """`config.dataset.num_classes`, or the count read from the data when it is 0."""
  dataset = resolve(config)
  d, spec = dataset.fields, dataset.spec
  if d.num_classes > 0:
    return d.num_classes
  if spec.kind == 'sequence':  # the labels are tokens
    return vocab_size(dataset)
  if spec.num_classes:
    return spec.num_classes
  if dataset.in_memory:
    from data import arrays  # pylint: disable=g-import-not-at-top

    return int(arrays.get_split(dataset, d.train_split).labels.max()) + 1
  from data import stream  # pylint: disable=g-import-not-at-top

  return stream.folder_num_classes(d.data_dir)


def num_examples(config, split: str) -> int:
  """The number of examples of `split` (all processes together)."""
  dataset = resolve(config)
  if dataset.in_memory:
    from data import arrays  # pylint: disable=g-import-not-at-top

    return len(arrays.get_split(dataset, split))
  from data import stream  # pylint: disable=g-import-not-at-top

  return stream.Source(dataset, split, 0, 1, drop_remainder=False).num_examples


def vocab_size(config) -> int:
  """Token ids of a token task are 0..vocab_size-1 (0 = padding; sequence labelling:
  `dataset.vocab_size`, no padding id)."""
  dataset = resolve(config)
  size = dataset.spec.vocab_size or dataset.fields.get('vocab_size', 0)
  if not size:
    raise ValueError(f'dataset {dataset.fields.name!r} is not a token task')
  return size


def prepare(config) -> None:
  """Makes sure the data can be read (TFDS download_and_prepare when allowed).

  Raises ValueError naming the field (data_dir, manual_dir, download, source,
  split) when the data is missing or cannot be prepared, and DownloadError when
  TFDS cannot download it. Call before any training work.
  """
  dataset = resolve(config)
  if dataset.source in ('tfds', 'folder'):
    from data import stream  # pylint: disable=g-import-not-at-top

    stream.prepare(dataset)
  if dataset.in_memory:
    from data import arrays  # pylint: disable=g-import-not-at-top

    for split in (dataset.fields.train_split, dataset.fields.eval_split):
      arrays.get_split(dataset, split)
