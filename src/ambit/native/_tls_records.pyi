import ssl
from typing import Final

READ_AGAIN: Final[int]
READ_MORE: Final[int]
READ_WANTS_WRITE: Final[int]
READ_EOF: Final[int]
READ_FAILED: Final[int]
OPENSSL_VERSION_NUMBER: Final[int]

class Records:
    held: int
    def __init__(
        self, tls: ssl.SSLSocket, sslobj: object, context: ssl.SSLContext, options: int, verify_mode: int
    ) -> None: ...
    def read(self, limit: int, /) -> tuple[bytes | None, int, OSError | None]: ...
    def write(self, data: bytes | bytearray | memoryview, /) -> int: ...
    def flush(self) -> int: ...
    def shutdown(self) -> bool: ...
    def close(self) -> None: ...
