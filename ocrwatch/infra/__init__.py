"""What every layer uses of the machine and the network: child processes, memory, logging, systemd,
the command line's streams, the HTTP listeners, the metrics and the S3 client.
"""
