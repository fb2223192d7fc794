"""What a document becomes: the Markdown and JSON sidecars, their JSON Schemas, and the further
outputs (the searchable PDF, the ALTO and hOCR files, the figures' files).
"""
