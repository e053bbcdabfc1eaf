"""Write records as Parquet spool segments: whole files, renamed into place atomically.

One writer per rank and record kind. A segment is written under a dot-prefixed ``.partial`` name and
``os.replace``d to ``<kind>/<node>_r<rank>_p<pid>_<seq>.parquet``, so a reader globbing ``*.parquet``
never sees half a file, and a rank killed mid-write leaves only an ignorable temporary file.

With a node spool (``Config.node_spool_dir``) the same files go to a node-local folder, and the node's
ranks take turns publishing them to the run folder, merged per kind (``_node_spool.py``), so the
shared filesystem sees a bounded number of files.
"""

from __future__ import annotations

import json
import logging
import operator
import os
import secrets

from ranksight.format.files import atomic_write_bytes
from ranksight.format.schema import KINDS, RANKS_DIR, SPOOL_SUFFIX, TMP_PREFIX, arrow_schema

from ._arrow_columns import build_column, repeated_column
from ._identity import Identity
from ._node_spool import LOCAL_SUFFIX, NodePublisher

_WARN_DIRECT_FROM_RANKS = 256
"""From this many ranks, rank 0 warns once when ranks write to the run folder directly (~2 files/s each)."""


class SpoolWriter:
    """Append record batches to a run directory as Parquet segments (to a node spool as Arrow IPC files,
    which its publisher merges into the run directory as Parquet)."""

    def __init__(
        self,
        run_path: str,
        identity: Identity,
        *,
        node_spool_dir: str | None = None,
        flush_interval_s: float = 2.0,
        max_job_files_per_s: float = 150.0,
    ) -> None:
        self.identity = identity
        self.publisher: NodePublisher | None = None
        if node_spool_dir:
            # Segments and the rank file go to the node's own disk; the run folder gets the node's merged
            # files once per publish interval (the folder must exist for readers from the start).
            os.makedirs(os.path.join(run_path, RANKS_DIR), exist_ok=True)
            local = os.path.join(node_spool_dir, os.path.basename(os.path.normpath(run_path)))
            self.publisher = NodePublisher(
                local,
                run_path,
                identity.node,
                flush_interval_s=flush_interval_s,
                world_size=identity.world_size,
                max_job_files_per_s=max_job_files_per_s,
                rank=identity.rank,
            )
            run_path = local
        elif identity.rank == 0 and identity.world_size >= _WARN_DIRECT_FROM_RANKS:
            logging.getLogger("ranksight").warning(
                "ranksight: %d ranks each writing to the run folder create ~%d files/s on it; a shared "
                "filesystem's metadata server feels that. Set node_spool_dir (RANKSIGHT_NODE_SPOOL) to a "
                "node-local folder to cap the job at max_job_files_per_s (docs/scale.md)",
                identity.world_size,
                2 * identity.world_size,
            )
        self.run_path = run_path
        self._seq: dict[str, int] = {}
        self._schemas: dict = {}
        self._made: set[str] = set()
        self.rows_written = 0
        # A random part per writer: a second monitor in one process (init twice, same run id) must not
        # reuse the first one's segment names and overwrite its rows.
        stem = f"{identity.node}_r{identity.rank:05d}_p{identity.pid}-{secrets.token_hex(3)}"
        self._stem = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in stem)
        os.makedirs(os.path.join(run_path, RANKS_DIR), exist_ok=True)

    def write(self, kind: str, rows: list[dict]) -> None:
        """Write one segment of ``kind`` rows (identity columns are added here)."""
        if not rows:
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = self._schemas.get(kind)
        if schema is None:
            schema = self._schemas[kind] = arrow_schema(kind)
        n = len(rows)
        labels = self.identity.labels()
        columns = []
        for col, field in zip(KINDS[kind], schema):
            if col.name in labels:
                columns.append(repeated_column(col.type, field.type, labels[col.name], n))
            else:
                columns.append(build_column(col.type, field.type, _column(rows, col.name)))
        table = pa.Table.from_arrays(columns, schema=schema)
        directory = os.path.join(self.run_path, kind)
        if directory not in self._made:
            os.makedirs(directory, exist_ok=True)
            self._made.add(directory)
        seq = self._seq.get(kind, 0)
        # On a node spool, segments are Arrow IPC files: only the node's publisher reads them, and they
        # cost a fourteenth of a Parquet segment to write and a seventh to read.
        suffix = LOCAL_SUFFIX if self.publisher is not None else SPOOL_SUFFIX
        final = os.path.join(directory, f"{self._stem}_{seq:06d}{suffix}")
        # The temporary name must not end in .parquet either: DuckDB's glob, unlike Python's, matches dot-files.
        tmp = os.path.join(directory, f"{TMP_PREFIX}{self._stem}_{seq:06d}{suffix}.partial")
        if self.publisher is not None:
            import pyarrow.ipc as ipc

            with ipc.new_file(tmp, table.schema) as sink:
                sink.write_table(table)
        else:
            pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, final)
        self._seq[kind] = seq + 1
        self.rows_written += n

    def write_meta(self, meta: dict) -> None:
        """Replace this rank's metadata file (identity, status, heartbeat, configuration).

        The agent writes it once per flush, after the flush's segments: with a node spool, this is where
        the node's publish happens when its interval is up, and always on the rank's last flush (a status
        other than ``running``), so a rank's last rows reach the run folder before it exits.
        """
        path = os.path.join(self.run_path, RANKS_DIR, f"rank-{self.identity.rank:05d}.json")
        atomic_write_bytes(path, json.dumps(meta, indent=1, default=str).encode(), durable=self.publisher is None)
        if self.publisher is not None:
            self.publisher.maybe_publish(final=meta.get("status", "running") != "running")


def _column(rows: list[dict], name: str) -> list:
    """The values of ``name`` down ``rows`` (None where a row lacks it): ``itemgetter`` over ``map`` runs in C,
    and the agent's rows of one kind usually all hold every key."""
    try:
        return list(map(operator.itemgetter(name), rows))
    except KeyError:
        return [r.get(name) for r in rows]
