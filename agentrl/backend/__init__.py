"""Backends own a model's inference server, trainer and checkpoints.

`LocalBackend` (local.py) runs them on this machine: its `Engine` (engine.py) of servers (serving/)
and trainer (training/) shared by the models of one base, and one `ModelSession` (session.py) per
model for its checkpoints and step. remote/ puts a `LocalBackend` behind HTTP for a `RemoteBackend`.
"""
