"""Artifact formats: one module per kind of trained drafter artifact (distilled draft, exit adapter,
Medusa heads), used both by the drafter that loads it and by the recipe that saves it. The pruned
vocabulary, shared by all of them, is `specdraft.vocab`; the record of the target each artifact was
made for, and the check on loading it, is `target_info`."""
