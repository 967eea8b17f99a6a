"""Prompts files read in chunks, as Ray's read tasks read them, give exactly the entries one process
reads (minirt/prompt_file.py's `read_prompts`, the independent whole-file path), with global indexes across
files, and a file of any size is never held whole.  No Ray needed.
"""

import json
import tracemalloc

import pytest

from minirt.distributed import prompt_chunks
from minirt.errors import MinirtError
from minirt.cli.prompt_file import read_prompts


def workload(n: int) -> list[str]:
    lines = []
    for i in range(n):
        lines.append(
            json.dumps({"prompt": f"line {i}", **({"max_new_tokens": i} if i % 3 == 0 else {})})
        )
        if i % 5 == 0:
            lines += ["", "{not json", '{"prompt": 5}']
    return lines


@pytest.mark.parametrize("entries_per_chunk", [1, 3, 7, 1000])
def test_chunks_give_the_entries_one_process_reads(tmp_path, entries_per_chunk):
    """Split anywhere, the chunks' rows are read_prompts' entries with their global indexes, across files."""
    first, second = tmp_path / "a.jsonl", tmp_path / "b.txt"
    first.write_bytes(b"\xef\xbb\xbf" + "\n".join(workload(23)).encode() + b"\n\n\xff\xfe bad\r\n")
    second.write_text("To be\n\n  \nor not\\nto be\r\nCaf\u00e9\n", encoding="utf-8")
    want = [e for path in (first, second) for e in read_prompts(str(path))]
    chunks = prompt_chunks.plan_chunks(
        prompt_chunks.prompt_files(str(tmp_path)), entries_per_chunk=entries_per_chunk
    )
    rows = [row for chunk in chunks for row in prompt_chunks.chunk_rows(chunk)]
    assert [row["index"] for row in rows] == list(range(len(want)))
    assert [json.loads(row["entry"]) for row in rows] == [e.__dict__ for e in want]
    assert max(c.entries for c in chunks) <= entries_per_chunk


def test_a_large_file_is_never_held_whole(tmp_path):
    big = tmp_path / "big.txt"
    line = ("x" * 200 + "\n").encode()
    with big.open("wb") as f:
        for _ in range(100):
            f.write(line * 1000)  # 20 MB, 100,000 prompts
    tracemalloc.start()
    try:
        chunks = prompt_chunks.plan_chunks([str(big)], entries_per_chunk=1000)
        rows = sum(1 for _ in prompt_chunks.chunk_rows(chunks[57]))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(chunks) == 100 and rows == 1000 and chunks[57].first_index == 57_000
    assert peak < 4 * 2**20  # a few MB at most for a 20 MB file


def test_a_source_with_no_prompts_or_not_utf8_is_refused_whole(tmp_path):
    (tmp_path / "blank.txt").write_text("\n  \n")
    with pytest.raises(MinirtError, match="no prompts"):
        prompt_chunks.plan_chunks([str(tmp_path / "blank.txt")])
    (tmp_path / "latin1.txt").write_bytes(b"\xe9t\xe9\n\xe0 bient\xf4t\n")
    with pytest.raises(MinirtError, match="not UTF-8"):
        prompt_chunks.plan_chunks([str(tmp_path / "latin1.txt")])
