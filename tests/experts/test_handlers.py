"""The moe/* handlers' own checks: node-local payload files, and where a loaded payload is kept."""

import os

import pytest

from apps.worker.expert_methods import read_regular_file
from core.errors import InvalidInput, NotFound, PayloadTooLarge


def test_a_regular_file_within_the_limit_is_read(tmp_path) -> None:
    path = tmp_path / "expert.safetensors"
    path.write_bytes(b"x" * 100)
    assert read_regular_file(str(path), max_bytes=100, what="expert") == b"x" * 100
    link = tmp_path / "link.safetensors"
    link.symlink_to(path)  # a link to a regular file is that file
    assert read_regular_file(str(link), max_bytes=100, what="expert") == b"x" * 100


def test_only_regular_files_within_the_limit_are_read(tmp_path) -> None:
    big = tmp_path / "big.safetensors"
    big.write_bytes(b"x" * 101)
    with pytest.raises(PayloadTooLarge, match="TENZRO_BLOB_MAX_BYTES") as too_big:
        read_regular_file(str(big), max_bytes=100, what="expert")
    assert too_big.value.details["limit_bytes"] == 100
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opening it would block forever: it must be refused before any read
    cases = {str(tmp_path): "not_a_file", str(fifo): "not_a_file", "/dev/zero": "not_a_file",
             str(tmp_path / "nope"): "file_not_found", "bad\x00name": "unreadable_file",
             "/" + "a" * 5000: "unreadable_file"}
    for path, reason in cases.items():
        with pytest.raises((InvalidInput, NotFound)) as info:
            read_regular_file(path, max_bytes=100, what="gate")
        assert info.value.reason == reason, (path[:40], info.value.reason)
