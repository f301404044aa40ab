"""`refuse_overwriting_sources`: an --overwrite never deletes the run a new run starts from, but a source inside the
run directory outside its run files (a recipe's import of a Hugging Face directory, RUN/source) survives the
overwrite, so it is not refused."""

from __future__ import annotations

import pytest

from tcsm.core.errors import ConfigError
from tcsm.train.rundir import refuse_overwriting_sources


def test_a_source_inside_the_run_is_refused_only_where_an_overwrite_deletes_it(tmp_path):
    run = tmp_path / "run"
    kept = run / "source" / "checkpoints" / "step_00000000"
    deleted = run / "checkpoints" / "step_00000002"
    for d in (kept, deleted):
        d.mkdir(parents=True)
    refuse_overwriting_sources(run, {"train": {"init_from": str(kept)}, "reference": {"path": str(kept)}})
    with pytest.raises(ConfigError, match="would delete"):
        refuse_overwriting_sources(run, {"train": {"init_from": str(deleted)}})
    with pytest.raises(ConfigError, match="would delete"):
        refuse_overwriting_sources(kept, {"train": {"init_from": str(kept)}})
