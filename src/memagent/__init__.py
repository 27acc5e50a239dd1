"""MemAgent: long documents read chunk by chunk with an overwritten, fixed-size text memory."""

__version__ = "0.1.0"
