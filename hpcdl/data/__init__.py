"""Datastores and batching: what the trainer reads its observations from."""
