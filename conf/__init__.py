"""Hydra configs, shipped as package data so `pkg://conf` works from a non-editable install."""
