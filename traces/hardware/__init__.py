"""Shipped hardware data: ``catalog.json`` (device specifications), read by ``traces.catalog``."""
