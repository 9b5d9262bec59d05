"""Files written whole or not at all, and JSON written strict (a non-finite float is null)."""

import contextlib
import json
import math
import os
import uuid

from etils import epath

from configs import fields


def _strict(obj):
  """`obj` with every non-finite float replaced by None (strict JSON has no NaN)."""
  if isinstance(obj, float) and not math.isfinite(obj):
    return None
  if isinstance(obj, dict):
    return {k: _strict(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [_strict(v) for v in obj]
  return obj


def dumps(obj, **kwargs) -> str:
  """Strict JSON text of `obj`: NaN and infinities become null."""
  return json.dumps(_strict(obj), allow_nan=False, **kwargs)


def write_atomic(path, text: str) -> None:
  """Writes the file `path` whole or not at all: `text` goes to a temporary file beside it
  (`<name>.tmp<pid>.<random>`), flushed to the disk (fsync, on a local disk), then renamed
  over `path` (a local or gs:// path). If any of it fails (a full disk), the temporary
  file is removed and the error raised: `path` keeps its old content, or stays absent."""
  path = epath.Path(path)
  tmp = path.parent / f'{path.name}.tmp{os.getpid()}.{uuid.uuid4().hex[:8]}'
  try:
    if fields.is_local(path):
      with open(os.fspath(tmp), 'w') as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    else:
      tmp.write_text(text)
    tmp.replace(path)
  except BaseException as e:
    with contextlib.suppress(OSError):
      tmp.unlink(missing_ok=True)
    if isinstance(e, OSError) and e.filename in (None, os.fspath(tmp)):
      e.filename = os.fspath(path)  # the file it was writing, not its temporary name
    raise


def write_json(path, name: str, obj) -> None:
  """Writes `path/name` as strict JSON, replacing it whole (`write_atomic`)."""
  write_atomic(epath.Path(path) / name, dumps(obj, indent=2, sort_keys=True))
