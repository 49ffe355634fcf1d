"""Local stand-in for the Databricks Runtime's ``pyspark.databricks.sql.chunk``.

Same names and signatures as the runtime's module. Executors write each partition, in
order, as Arrow chunks of at most ``max_bytes_per_chunk`` bytes (a partition becomes
several chunks when it is larger) to Arrow IPC files under ``STORE``, which every local
process can read; a chunk's id is its file's path. ``persistDataFrameAsChunks`` lists the
chunks in no particular order (the runtime promises none, and a ``ChunkMeta`` does not
name its partition), and records them in ``PERSISTED``. ``unpersistChunks`` deletes the
files and records the ids in ``UNPERSISTED``. A ``FAIL_READS`` file in ``STORE`` makes
``readChunk`` raise.
"""

from __future__ import annotations

import os
import tempfile
from collections import namedtuple

import pyarrow as pa

ChunkMeta = namedtuple("ChunkMeta", ["id", "row_count", "byte_count"])

#: Where the chunks go: one directory per driver process.
STORE = os.path.join(tempfile.gettempdir(), f"raybricks-chunk-standin-{os.getpid()}")
#: A file of this name in STORE makes every readChunk fail.
FAIL_READS = "FAIL_READS"
#: Every chunk persisted, and every chunk id unpersisted, in this process.
PERSISTED: list[ChunkMeta] = []
UNPERSISTED: list[str] = []


def persistDataFrameAsChunks(dataframe, max_bytes_per_chunk: int) -> list[ChunkMeta]:  # noqa: N802
    """Persist the DataFrame's partitions as Arrow chunks; their (id, row_count, byte_count)."""
    store = STORE
    os.makedirs(store, exist_ok=True)

    def write_chunks(batches):  # runs on the executors; a local function is shipped by value
        import os
        import uuid

        import pyarrow as pa

        table = pa.Table.from_batches(list(batches))
        if table.num_rows == 0:
            return
        per_row = max(table.nbytes / table.num_rows, 1.0)
        step = max(int(max_bytes_per_chunk // per_row), 1)
        for start in range(0, table.num_rows, step):
            chunk = table.slice(start, step).combine_chunks()
            path = os.path.join(store, f"{uuid.uuid4().hex}.arrow")
            with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, chunk.schema) as writer:
                writer.write_table(chunk)
            yield pa.RecordBatch.from_pydict(
                {"id": [path], "row_count": [chunk.num_rows], "byte_count": [chunk.nbytes]}
            )

    rows = dataframe.mapInArrow(
        write_chunks, "id string, row_count long, byte_count long"
    ).collect()
    chunks = sorted((ChunkMeta(r.id, r.row_count, r.byte_count) for r in rows),
                    key=lambda chunk: chunk.id)  # random ids: no particular order
    PERSISTED.extend(chunks)
    return chunks


def readChunk(chunk_id: str) -> pa.Table:  # noqa: N802
    """One chunk as an Arrow table (from any local process)."""
    if os.path.exists(os.path.join(os.path.dirname(chunk_id), FAIL_READS)):
        raise RuntimeError(f"injected failure reading chunk {chunk_id}")
    with pa.memory_map(chunk_id) as source:
        return pa.ipc.open_file(source).read_all()


def unpersistChunks(chunk_ids: list[str]) -> None:  # noqa: N802
    """Free the chunks."""
    for chunk_id in chunk_ids:
        if os.path.exists(chunk_id):
            os.remove(chunk_id)
    UNPERSISTED.extend(chunk_ids)
