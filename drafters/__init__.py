"""Drafters: one file per strategy, each implements `specdraft.protocol.Drafter`."""
