"""Config files in and out: one reader that turns every way a YAML file can be wrong into a
ConfigError naming the file, and one writer that never leaves a half-written file.

Example::

    data = read_yaml("hetero.yaml")                 # plain data, or ConfigError "config='hetero.yaml' ..."
    write_atomic("hetero.yaml", yaml.safe_dump(data))
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from hetero_strategy.config.errors import _fail

__all__ = ["read_yaml", "write_atomic"]

_AGAIN = "fix the file or write it again with `hetero-strategy config`"


def read_yaml(path: str | Path, field_name: str = "config") -> Any:
    """The YAML document at ``path`` (None for an empty file).

    Raises:
        ConfigError: ``<field_name>='<path>' is invalid: ...`` when the file cannot be read, is not
            UTF-8/UTF-16 text, is not YAML, or nests too deeply to read.
    """
    try:
        raw = Path(path).read_bytes()
    except (OSError, ValueError) as e:  # ValueError: a NUL in the path
        _fail(field_name, str(path), f"cannot read it ({getattr(e, 'strerror', None) or e}); check the path")
    try:
        return yaml.safe_load(raw)  # NOTE: bytes, so YAML itself detects UTF-8/16 and refuses other bytes
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        problem = getattr(e, "problem", None) or getattr(e, "reason", None) or type(e).__name__
        _fail(field_name, str(path), f"not valid YAML{line} ({problem}); {_AGAIN}")
    except RecursionError:
        _fail(field_name, str(path), f"nested too deeply to be a config; {_AGAIN}")


def write_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory and a rename, so a
    reader sees the old file or the whole new one, never a part."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.fchmod(fd, 0o666 & ~umask)  # as open() would create it; mkstemp's file is 0600
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
