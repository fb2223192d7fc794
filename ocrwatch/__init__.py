"""ocrwatch: watch inboxes and buckets, OCR every new document, write sidecars beside it."""

__version__ = "0.1.0"
