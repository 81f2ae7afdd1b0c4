"""TLS material for the API server and the mesh: CAs, server and client certificates (ECDSA P-256)."""
