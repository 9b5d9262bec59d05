"""The canvas a batch of Pathfinder images is drawn on (`pathfinder_contours`): the pixels,
and which path owns each cell, so that paths keep apart."""

import numpy as np

_WALL = -1  # owner of canvas cells that no path point may occupy
_NEVER = np.iinfo(np.int32).max  # stamp of cells that are not path points
_SELF_SPAN = 2  # a point may touch its own path's last 2 points (a bend)


class Canvas:
  """A batch of images being drawn, with the bookkeeping that keeps paths apart.

  Coordinates are canvas coordinates: image coordinates + `pad`, where the
  border `pad` is wide enough that no candidate point nor its 5x5
  neighbourhood leaves the canvas, so lookups need no clipping.

  owner: int16 `[b, g, g]` (g = size + 2 pad): 0 free, _WALL, or the id
    (1, 2, ...) of the path whose point or reserved disc occupies the cell.
    Path points may lie in image rows and columns 1..size-2 only, so a disc
    around any point fits in the image.
  stamp: int32 `[b, g, g]`: when the cell's point was drawn (_NEVER if none).
  image: uint8 `[b, size, size]`, 0 or 255.
  clock: int32 `[b]`, the last stamp used per image.
  """

  def __init__(self, batch: int, size: int, pad: int):
    g = size + 2 * pad
    self.size, self.pad, self.g = size, pad, g
    self.owner = np.full((batch, g, g), _WALL, np.int16)
    self.owner[:, pad + 1 : pad + size - 1, pad + 1 : pad + size - 1] = 0
    self.stamp = np.full((batch, g, g), _NEVER, np.int32)
    self.image = np.zeros((batch, size, size), np.uint8)
    self.clock = np.zeros(batch, np.int32)
    self._base = np.arange(batch) * g * g
    d = np.arange(-2, 3)
    self._ring = {
      r: ((d[2 - r : 3 + r, None] * g) + d[None, 2 - r : 3 + r]).ravel() for r in (1, 2)
    }

  def _flat(self, b, ys, xs):
    return self._base[b][:, None] + ys * self.g + xs

  def fits(self, b, ys, xs, pid, stamps):
    """Whether all k new points of path `pid` fit: inside, and no other path or old own point
    in their 3x3 neighbourhoods. b `[m]`, ys/xs/stamps `[m, k]` -> `[m]`."""
    flat = self._flat(b, ys, xs)
    owner, stamp = self.owner.reshape(-1), self.stamp.reshape(-1)
    near = flat[..., None] + self._ring[1]
    owners = owner[near]
    clash = (owners > 0) & (owners != pid)
    clash |= (owners == pid) & (stamp[near] < stamps[..., None] - _SELF_SPAN)
    return (owner[flat] != _WALL).all(1) & ~clash.any((1, 2))

  def clear(self, b, y, x, pid):
    """Whether no other path lies within 2 pixels of points y, x `[m]` (room for a disc)."""
    owners = self.owner.reshape(-1)[self._flat(b, y[:, None], x[:, None]) + self._ring[2]]
    return ~((owners > 0) & (owners != pid)).any(1)

  def draw(self, b, ys, xs, pid, stamps, on):
    """Records points `[m, k]` of path `pid`; paints those where `on` `[k]`."""
    flat = self._flat(b, ys, xs)
    self.owner.reshape(-1)[flat] = pid
    self.stamp.reshape(-1)[flat] = stamps
    self.image[b[:, None], ys[:, on] - self.pad, xs[:, on] - self.pad] = 255
    self.clock[b] = stamps[:, -1]

  def reserve(self, b, y, x, pid):
    """Claims the free cells of a 3x3 disc around points y, x `[m]` for path `pid`."""
    owner = self.owner.reshape(-1)
    cells = self._flat(b, y[:, None], x[:, None]) + self._ring[1]
    owner[cells] = np.where(owner[cells] == 0, pid, owner[cells])

  def paint_disc(self, b, y, x):
    """Paints 3x3 discs around points y, x `[m]`."""
    for dy in (-1, 0, 1):
      for dx in (-1, 0, 1):
        self.image[b, y + dy - self.pad, x + dx - self.pad] = 255
