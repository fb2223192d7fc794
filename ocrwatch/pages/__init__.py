"""A document as pages: its kind and page count probed, each page rendered and turned upright, what
a PDF page draws read within bounds, and the scheduler that queues the pages of every document for
the engine.
"""
