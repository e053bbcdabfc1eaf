"""A digest file's parts read back as they were written, whichever way ``read_parts`` takes them: a part of one
record batch straight after its schema message, any other (several batches, dictionaries, none, compressed)
through the IPC file reader; a damaged part is a ``DigestError`` naming its file."""

import os

import pyarrow as pa
import pytest

from ranksight.format.digest_file import DigestError, _one_batch, pack_parts, read_digest_parts, read_parts


def _table(n: int, offset: int = 0) -> pa.Table:
    return pa.table(
        {
            "rank": pa.array(range(offset, offset + n), pa.int32()),
            "node": pa.array([f"node{i % 3}" for i in range(n)]),
            "value": pa.array([i * 0.5 if i % 4 else None for i in range(n)], pa.float64()),
        }
    )


PARTS = {
    "one_batch": _table(10),
    "several_batches": pa.concat_tables([_table(4), _table(3, 4)]),
    "dictionary": pa.table({"node": pa.array(["a", "b", "a"]).dictionary_encode(), "n": [1, 2, 3]}),
    "empty": _table(0),
}


def _written(tmp_path, parts: dict) -> str:
    path = tmp_path / "node0000_m0.parquet"
    path.write_bytes(pack_parts(parts))
    return str(path)


def test_every_kind_of_part_reads_back_as_written(tmp_path):
    path = _written(tmp_path, PARTS)
    found = read_parts(path, tuple(PARTS))
    for name, table in PARTS.items():
        assert found[name].equals(table.combine_chunks()) or found[name].equals(table), name
        assert found[name].schema.equals(table.schema), name
    whole = read_digest_parts([path, path], ("one_batch", "several_batches"))
    assert whole["one_batch"].equals(pa.concat_tables([PARTS["one_batch"]] * 2))
    assert whole["several_batches"].to_pylist() == PARTS["several_batches"].to_pylist() * 2


def test_only_a_part_of_one_plain_batch_is_read_as_its_message():
    def body(table: pa.Table) -> pa.Buffer:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        return sink.getvalue()

    assert _one_batch(body(PARTS["one_batch"])).equals(PARTS["one_batch"].to_batches()[0])
    assert _one_batch(body(PARTS["several_batches"])) is None
    assert _one_batch(body(PARTS["dictionary"])) is None
    assert _one_batch(body(PARTS["empty"])) is None
    assert _one_batch(body(PARTS["one_batch"]).slice(0, 40)) is None  # cut short: the file reader says why


@pytest.mark.parametrize("where", ["schema", "batch"])
def test_a_damaged_part_is_a_digest_error_naming_its_file(tmp_path, where):
    path = _written(tmp_path, {"one_batch": _table(50)})
    data = bytearray(open(path, "rb").read())
    start = data.index(b"ARROW1")
    # the schema message's flatbuffer, or the batch message's: both are checked before a value is read
    at = start + 16 if where == "schema" else start + data[start:].index(b"\xff\xff\xff\xff", 16) + 8
    data[at : at + 24] = b"\x7f" * 24
    with open(path, "wb") as f:
        f.write(bytes(data))
    with pytest.raises(DigestError, match=os.path.basename(path)):
        read_digest_parts([path], ("one_batch",))
