"""Build Arrow columns from Python lists without pyarrow's conversion path.

``pa.array(list)`` (and even ``pa.scalar``) probes for pandas objects, and that probe imports pandas
whenever it is installed: ~38 MB of RSS in every rank for a library the agent never uses (the agent's RSS per
rank went from ~85 MB to ~45 MB without it). Building the buffers ourselves with ``array.array`` and
``pa.Array.from_buffers`` keeps pandas out of the training process.

The agent thread builds every column of every flush here while it holds the GIL that a host-bound training
thread needs, so each path does its per-value work in C where it can: ``list.count`` for the nulls,
``array.array`` straight from a list without nulls, a validity bitmap packed by Arrow's cast from one byte a
value, and a repeated value (the identity columns) built once.
"""

from __future__ import annotations

import operator
import sys
from array import array
from itertools import repeat

_TYPECODES = {"int64": "q", "int32": "i", "float64": "d"}


def _bitmap(flags: bytes):
    """Pack one byte a value (0 or 1) into an Arrow (LSB-first) bitmap buffer, in C: with numpy's ``packbits``
    where numpy is loaded (torch loads it), else a uint8 array cast to bool. Why: importing ``pyarrow.compute``
    took 0.12 s of the agent thread's 0.22 s CPU in a 200-step job (cProfile of the agent thread)."""
    import pyarrow as pa

    np = sys.modules.get("numpy")
    if np is not None:
        return pa.py_buffer(np.packbits(np.frombuffer(flags, np.uint8), bitorder="little"))
    import pyarrow.compute as pc

    n = len(flags)
    as_bytes = pa.Array.from_buffers(pa.uint8(), n, [None, pa.py_buffer(flags)])
    return pc.cast(as_bytes, pa.bool_()).buffers()[1]


def build_column(kind: str, arrow_type, values: list):
    """Return an Arrow array of ``values`` (None = null) for a schema type name (ranksight.format.schema)."""
    import pyarrow as pa

    n = len(values)
    nulls = values.count(None)
    if n and nulls == n:
        return pa.nulls(n, arrow_type)
    validity = _bitmap(bytes(map(operator.is_not, values, repeat(None)))) if nulls else None
    if kind in _TYPECODES:
        code = _TYPECODES[kind]
        if nulls:
            zero = 0.0 if kind == "float64" else 0
            data = array(code, [zero if v is None else v for v in values])
        else:
            data = array(code, values)
        buffers = [validity, pa.py_buffer(data)]
    elif kind == "bool":
        buffers = [validity, _bitmap(bytes(map(bool, values)))]
    elif kind == "string":
        offsets, chunks, total = array("i", [0]), [], 0
        for v in values:
            if v is not None:
                encoded = str(v).encode("utf-8")
                chunks.append(encoded)
                total += len(encoded)
            offsets.append(total)
        buffers = [validity, pa.py_buffer(offsets), pa.py_buffer(b"".join(chunks))]
    else:
        raise TypeError(f"no column builder for schema type {kind!r}")
    return pa.Array.from_buffers(arrow_type, n, buffers, null_count=nulls)


def repeated_column(kind: str, arrow_type, value, n: int):
    """An Arrow array of ``value`` ``n`` times (an identity column: the same on every row of a segment),
    built from one encoded value instead of ``n``."""
    import pyarrow as pa

    if value is None or n == 0:
        return build_column(kind, arrow_type, [value] * n)
    if kind in _TYPECODES:
        return pa.Array.from_buffers(arrow_type, n, [None, pa.py_buffer(array(_TYPECODES[kind], [value]) * n)])
    if kind == "string":
        encoded = str(value).encode("utf-8")
        offsets = array("i", range(0, (n + 1) * len(encoded), len(encoded))) if encoded else array("i", [0]) * (n + 1)
        return pa.Array.from_buffers(arrow_type, n, [None, pa.py_buffer(offsets), pa.py_buffer(encoded * n)])
    return build_column(kind, arrow_type, [value] * n)
