class DataPath:
    """DATA frames of an HBONE core's attached streams, parsed in C (``hbone_data.c``)."""

    frames: int
    octets: int
    def __init__(self, core: object, session: object) -> None: ...
    def feed(self, data: bytes, /) -> int: ...
