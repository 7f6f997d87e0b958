"""Where checkpoint bytes come from: a local folder or an http(s) URL base, read by range.

HTTP: every ranged read is ``Range: bytes=a-b`` and must come back 206 with a Content-Range
naming exactly that range and a body of exactly that length; a server that answers 200
(ignoring Range) is refused before its body is read. Connection errors and 5xx are retried
with exponential backoff. Pure module (httpx), never Django.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx

from core.errors import TenzroError

MAX_JSON = 64 * 1024 * 1024  # config.json / index: a few MB at most for the largest hub models
_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")


class CheckpointError(TenzroError, ValueError):
    """A checkpoint that cannot be read as asked. ``reason`` is machine-readable:

    not_found, fetch_failed, config_invalid, index_invalid, header_truncated, header_too_large,
    header_corrupt, tensor_missing, dtype_unsupported, offsets_invalid, short_read, range_ignored.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message, reason=reason)



class LocalSource:
    def __init__(self, root: Path) -> None:
        self.root = root

    def describe(self, name: str) -> str:
        return str(self.root / name)

    def read_small(self, name: str) -> bytes:
        path = self.root / name
        try:
            if not path.is_file():
                raise CheckpointError("not_found", f"{path} does not exist")
            if path.stat().st_size > MAX_JSON:
                raise CheckpointError("fetch_failed", f"{path} is larger than {MAX_JSON} bytes")
            return path.read_bytes()
        except OSError as exc:  # unreadable (permissions, a name too long): the bytes are not ours to read
            raise CheckpointError("fetch_failed", f"cannot read {path}: {exc.strerror}") from exc

    def read_range(self, name: str, start: int, length: int, *, allow_short: bool) -> tuple[bytes, int]:
        """Bytes [start, start+length) and the file size; short only at EOF when allow_short."""
        path = self.root / name
        try:
            with path.open("rb") as fh:
                size = fh.seek(0, 2)
                fh.seek(start)
                data = fh.read(length)
        except FileNotFoundError:
            raise CheckpointError("not_found", f"{path} does not exist") from None
        except OSError as exc:
            raise CheckpointError("fetch_failed", f"cannot read {path}: {exc.strerror}") from exc
        if len(data) != length and not (allow_short and start + len(data) == size):
            raise CheckpointError("short_read", f"{path}: read {len(data)} of {length} bytes at offset {start} "
                                                f"(file is {size} bytes)")
        return data, size

    def close(self) -> None:
        pass


class HttpSource:
    def __init__(self, base: str, *, retries: int, backoff_s: float, timeout_s: float,
                 client: httpx.Client | None) -> None:
        self.base = base.rstrip("/")
        self.retries = retries
        self.backoff_s = backoff_s
        self.client = client or httpx.Client(follow_redirects=True, timeout=timeout_s)
        self._own_client = client is None

    def describe(self, name: str) -> str:
        return f"{self.base}/{name}"

    def _request(self, name: str, headers: dict[str, str], handle):
        """Run `handle(response)` on a streamed GET, retrying connection errors and 5xx."""
        url = self.describe(name)
        last: str = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                with self.client.stream("GET", url, headers=headers) as resp:
                    if resp.status_code >= 500:
                        last = f"HTTP {resp.status_code}"
                        continue
                    if resp.status_code == 404:
                        raise CheckpointError("not_found", f"{url}: HTTP 404")
                    return handle(resp)
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}"
        raise CheckpointError("fetch_failed", f"{url}: failed after {self.retries + 1} attempts ({last})")

    def read_small(self, name: str) -> bytes:
        url = self.describe(name)

        def handle(resp: httpx.Response) -> bytes:
            if resp.status_code != 200:
                raise CheckpointError("fetch_failed", f"{url}: HTTP {resp.status_code}")
            chunks, total = [], 0
            for chunk in resp.iter_bytes():
                total += len(chunk)
                if total > MAX_JSON:
                    raise CheckpointError("fetch_failed", f"{url} is larger than {MAX_JSON} bytes")
                chunks.append(chunk)
            return b"".join(chunks)

        return self._request(name, {"Accept-Encoding": "identity"}, handle)

    def read_range(self, name: str, start: int, length: int, *, allow_short: bool) -> tuple[bytes, int]:
        url = self.describe(name)
        end = start + length - 1

        def handle(resp: httpx.Response) -> tuple[bytes, int]:
            if resp.status_code == 200:
                # Closing the stream here drops the connection without reading the body.
                raise CheckpointError("range_ignored", f"{url}: the server ignored 'Range: bytes={start}-{end}' "
                                                       "(HTTP 200); refusing to download the whole file")
            if resp.status_code == 416 and allow_short:
                raise CheckpointError("header_truncated", f"{url}: range {start}-{end} not satisfiable (HTTP 416)")
            if resp.status_code != 206:
                raise CheckpointError("fetch_failed", f"{url}: HTTP {resp.status_code} for range {start}-{end}")
            match = _CONTENT_RANGE.match(resp.headers.get("content-range", ""))
            if not match or match.group(3) == "*":
                raise CheckpointError("range_ignored", f"{url}: 206 without a usable Content-Range "
                                                       f"({resp.headers.get('content-range')!r})")
            got_start, got_end, size = int(match.group(1)), int(match.group(2)), int(match.group(3))
            clipped = allow_short and got_end == size - 1 and got_end < end
            if got_start != start or (got_end != end and not clipped):
                raise CheckpointError("range_ignored", f"{url}: asked for bytes {start}-{end}, "
                                                       f"server sent {got_start}-{got_end}/{size}")
            want = got_end - got_start + 1
            chunks, total = [], 0
            for chunk in resp.iter_bytes():
                total += len(chunk)
                if total > want:
                    raise CheckpointError("short_read", f"{url}: body longer than the {want} bytes of "
                                                        f"Content-Range {got_start}-{got_end}")
                chunks.append(chunk)
            if total != want:
                raise CheckpointError("short_read", f"{url}: received {total} of {want} bytes "
                                                    f"for range {got_start}-{got_end}")
            return b"".join(chunks), size

        headers = {"Range": f"bytes={start}-{end}", "Accept-Encoding": "identity"}
        try:
            return self._request(name, headers, handle)
        except httpx.HTTPError as exc:  # e.g. RemoteProtocolError mid-body after retries were spent
            raise CheckpointError("short_read", f"{url}: {type(exc).__name__}: {exc}") from None

    def close(self) -> None:
        if self._own_client:
            self.client.close()
