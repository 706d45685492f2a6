"""Trainer ranks: M trainer processes driven as one, on this host or joined from others."""
