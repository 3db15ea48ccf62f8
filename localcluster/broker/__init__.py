"""The broker runtime: sockets, files, timers and the event loop around the sans-I/O cores.

`python -m localcluster.broker --id N --cluster-dir DIR [--set key=value ...]` runs one.
"""
