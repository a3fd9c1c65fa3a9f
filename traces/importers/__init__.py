"""Importers that turn other tools' traces into MindPipe's trace contract."""
