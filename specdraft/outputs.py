"""Output folders of the recipes and exports: checked before any work, never overwritten silently.

Every recipe (`specdraft-train-draft`, `-train-medusa`, `-train-early-exit`, `-train-eagle`, `specdraft-selfgen`)
and `specdraft-export` call `prepare_output_dir` on each folder it will write, before it
loads a model: the folder is created, a non-empty one is refused unless the config says
`overwrite=true`, and a probe file is written (and removed) so that a read-only folder is one clear
error now rather than a traceback after the work. By default the recipes write under Hydra's run
directory (`outputs/<date>/<time>/...`); they write into the package's shipped artifact folders
only when `out_dir` names one (and, as those are not empty, with `overwrite=true`).
"""

from __future__ import annotations

import os
from pathlib import Path

PROBE_NAME = ".specdraft-write-probe"


def prepare_output_dir(path: str | Path, overwrite: bool, key: str = "out_dir") -> Path:
    """Create the output folder `path` (config key `key`) and check it can take the outputs.

    Raises FileExistsError for a non-empty folder without overwrite (or a file in its place),
    PermissionError for one that cannot be created or written. Returns the folder.
    """
    out = Path(path).expanduser()
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{key}={str(path)!r} is a file, not a folder; choose a folder for {key}.")
    if out.is_dir() and not overwrite:
        entries = sorted(p.name for p in out.iterdir())
        if entries:
            shown = ", ".join(entries[:4]) + (f" and {len(entries) - 4} more" if len(entries) > 4 else "")
            raise FileExistsError(
                f"{key}={str(path)!r} is not empty (it has {shown}); pass overwrite=true to write into "
                f"it anyway, or choose an empty or new {key}."
            )
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f"{PROBE_NAME}-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise PermissionError(
            f"cannot write to {key}={str(path)!r} ({err.strerror or err}); choose a folder you can write to."
        ) from None
    return out
