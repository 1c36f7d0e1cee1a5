"""The one pydantic base every deploy-config model derives from."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """Unknown keys are errors and values are not coerced across types.

    ``strict`` keeps YAML's own typing honest: ``max_num_seqs: "10"`` or ``max_num_seqs: 4.0`` is a mistake
    in the file, not something to guess at (vllm-omni's untyped ``extra`` bag accepted anything). ``frozen``
    because one loaded config is shared by every component of a process.
    """

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
