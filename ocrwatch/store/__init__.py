"""What ocrwatch keeps in its own SQLite file: the ledger of jobs, the record of the outputs it
wrote (the one ownership rule) and the hook deliveries still owed.
"""
