"""A page's text: the PDF's own where it is good, else the engine's, with the retry ladder, the
engine's supervision and the figures cut from the page.
"""
