"""tf.data preprocessing: decode, resize, augment, normalise images; bytes to ids.

Randomness is stateless: every random op takes a `[2]` int64 seed derived from
(epoch seed, example position), so a pipeline is deterministic however many
threads run it, and skipping examples does not change the others.
"""

from typing import Sequence

import tensorflow as tf

CROP_FRACTION = 0.875  # eval: resize the short side to size / 0.875, crop the centre


def decode_image(data: tf.Tensor, channels: int) -> tf.Tensor:
  """Encoded PNG/JPEG bytes -> uint8 `[h, w, channels]`."""
  image = tf.io.decode_image(data, channels=channels, expand_animations=False)
  image.set_shape([None, None, channels])
  return image


def resize(image: tf.Tensor, size: int) -> tf.Tensor:
  """Any image -> float32 `[size, size, c]` (values kept in the input's range)."""
  image = tf.cast(image, tf.float32)
  shape = tf.shape(image)
  if image.shape[0] == size and image.shape[1] == size:
    return image
  return tf.cond(
    tf.logical_and(tf.equal(shape[0], size), tf.equal(shape[1], size)),
    lambda: image,
    lambda: tf.image.resize(image, [size, size], antialias=True),
  )


def normalize(image: tf.Tensor, mean: Sequence[float], std: Sequence[float]) -> tf.Tensor:
  """Pixels in [0, 255] -> (x / 255 - mean) / std, float32."""
  image = tf.cast(image, tf.float32) / 255.0
  return (image - tf.constant(mean, tf.float32)) / tf.constant(std, tf.float32)


def pad_crop_flip(image: tf.Tensor, size: int, seed: tf.Tensor) -> tf.Tensor:
  """CIFAR augmentation: resize, zero-pad size/8 pixels, random size x size crop, flip."""
  crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
  image = resize(image, size)
  pad = max(size // 8, 1)
  image = tf.pad(image, [[pad, pad], [pad, pad], [0, 0]])
  image = tf.image.stateless_random_crop(image, [size, size, image.shape[-1]], crop_seed)
  return tf.image.stateless_random_flip_left_right(image, flip_seed)


def inception_crop_flip(image: tf.Tensor, size: int, seed: tf.Tensor) -> tf.Tensor:
  """ImageNet augmentation: random area 5-100% and aspect 3/4-4/3 crop, resize, flip."""
  crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
  begin, crop_size, _ = tf.image.stateless_sample_distorted_bounding_box(
    tf.shape(image),
    tf.zeros([0, 0, 4], tf.float32),
    seed=crop_seed,
    area_range=(0.05, 1.0),
    aspect_ratio_range=(3 / 4, 4 / 3),
    min_object_covered=0.0,
    use_image_if_no_bounding_boxes=True,
  )
  image = tf.slice(image, begin, crop_size)
  image = tf.image.resize(tf.cast(image, tf.float32), [size, size], antialias=True)
  return tf.image.stateless_random_flip_left_right(image, flip_seed)


def resize_small_central_crop(image: tf.Tensor, size: int) -> tf.Tensor:
  """ImageNet evaluation: short side to size / CROP_FRACTION, then the central crop."""
  shape = tf.cast(tf.shape(image)[:2], tf.float32)
  scale = (size / CROP_FRACTION) / tf.reduce_min(shape)
  new_shape = tf.cast(tf.math.ceil(shape * scale), tf.int32)
  image = tf.image.resize(tf.cast(image, tf.float32), new_shape, antialias=True)
  top = (new_shape[0] - size) // 2
  left = (new_shape[1] - size) // 2
  return tf.image.crop_to_bounding_box(image, top, left, size, size)


def image_example(
  data: tf.Tensor,
  *,
  size: int,
  channels: int,
  augment: str,
  train: bool,
  mean: Sequence[float],
  std: Sequence[float],
  seed=None,
) -> tf.Tensor:
  """Encoded image -> normalised float32 `[size, size, channels]`.

  augment: 'none' (resize only), 'crop_flip' (CIFAR style) or 'inception_crop'
  (ImageNet style: random-resized crop for training, centre crop for eval).
  """
  image = decode_image(data, channels)
  if augment == 'inception_crop':
    image = (
      inception_crop_flip(image, size, seed) if train else resize_small_central_crop(image, size)
    )
  elif augment == 'crop_flip' and train:
    image = pad_crop_flip(image, size, seed)
  else:
    image = resize(image, size)
  image = normalize(image, mean, std)
  image.set_shape([size, size, channels])
  return image


def pixel_tokens(data: tf.Tensor, *, size: int, channels: int) -> tf.Tensor:
  """Encoded image -> int32 `[size * size * channels]` raster-order tokens 0..255.

  No resizing: the stored image must be `size` x `size` (MNIST: 28).
  """
  image = decode_image(data, channels)
  shape = tf.shape(image)
  tf.debugging.assert_equal(
    shape[:2],
    tf.constant([size, size]),
    message=f'pixels_as_tokens reads images at their stored size, which differs from '
    f'config.dataset.image_size={size}',
  )
  return tf.reshape(tf.cast(image, tf.int32), [size * size * channels])


def byte_tokens(text: tf.Tensor, max_length: int) -> tf.Tensor:
  """A UTF-8 string -> int32 `[max_length]`: byte b becomes id b + 1, 0 pads."""
  ids = tf.cast(tf.io.decode_raw(text, tf.uint8), tf.int32)[:max_length] + 1
  ids = tf.pad(ids, [[0, max_length - tf.shape(ids)[0]]])
  ids.set_shape([max_length])
  return ids
