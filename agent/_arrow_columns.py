"""Build Arrow columns from Python lists without pyarrow's conversion path.

``pa.array(list)`` (and even ``pa.scalar``) probes for pandas objects, and that probe imports pandas
whenever it is installed: ~38 MB of RSS in every rank for a library the agent never uses
(docs/benchmarks.md, memory). Building the buffers ourselves with ``array.array`` and
``pa.Array.from_buffers`` keeps pandas out of the training process.
"""

from __future__ import annotations

from array import array

_TYPECODES = {"int64": "q", "int32": "i", "float64": "d"}


def _bitmap(flags) -> bytes:
    """Pack booleans into an Arrow (LSB-first) bitmap."""
    bits = bytearray((len(flags) + 7) // 8)
    for i, flag in enumerate(flags):
        if flag:
            bits[i >> 3] |= 1 << (i & 7)
    return bytes(bits)


def build_column(kind: str, arrow_type, values: list):
    """Return an Arrow array of ``values`` (None = null) for a schema type name (ranksight.schema)."""
    import pyarrow as pa

    n = len(values)
    nulls = sum(1 for v in values if v is None)
    validity = pa.py_buffer(_bitmap([v is not None for v in values])) if nulls else None
    if kind in _TYPECODES:
        zero = 0.0 if kind == "float64" else 0
        data = array(_TYPECODES[kind], [zero if v is None else v for v in values])
        buffers = [validity, pa.py_buffer(data.tobytes())]
    elif kind == "bool":
        buffers = [validity, pa.py_buffer(_bitmap([bool(v) for v in values]))]
    elif kind == "string":
        offsets, chunks, total = array("i", [0]), [], 0
        for v in values:
            if v is not None:
                encoded = str(v).encode("utf-8")
                chunks.append(encoded)
                total += len(encoded)
            offsets.append(total)
        buffers = [validity, pa.py_buffer(offsets.tobytes()), pa.py_buffer(b"".join(chunks))]
    else:
        raise TypeError(f"no column builder for schema type {kind!r}")
    return pa.Array.from_buffers(arrow_type, n, buffers, null_count=nulls)
