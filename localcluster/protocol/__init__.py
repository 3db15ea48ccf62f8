"""The Kafka wire protocol: framing and headers (api.py), kio-encoded messages
(messages.py), and the hand-written hot path (produce.py, fetch.py) over wire.py's
bounds-checked primitives. Bytes in, dataclasses out; no sockets here.
"""
