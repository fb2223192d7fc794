"""What a user runs: the daemon's life cycle, the command line, the checks a start makes and
``ocrwatch ocr``'s report.
"""
