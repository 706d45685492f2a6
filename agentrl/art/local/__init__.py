"""ART's `art.local`."""

from .backend import LocalBackend, LocalTrainResult

__all__ = ["LocalBackend", "LocalTrainResult"]
