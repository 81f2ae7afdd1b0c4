"""Generated protobuf modules, one per file in ``proto/``; committed, never edited by hand.

Regenerate with ``scripts/gen_proto.sh`` (it uses the pinned grpcio-tools); ``tests/unit/test_proto_fresh.py`` fails
when a committed module no longer matches its ``.proto``.
"""
