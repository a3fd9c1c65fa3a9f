"""Shipped traces (JSON), made by MindPipe's own tools; see each file's provenance."""
