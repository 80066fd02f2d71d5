"""The service boundary: the catalogue of endpoints, the client, the sandbox."""
