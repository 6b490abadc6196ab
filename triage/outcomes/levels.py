"""The levels a loss is judged against, as measured (experiments/levels.py, at the checkpoint): the loss of
learning nothing (a constant prediction, or ln K) and the least the loss can score (its floor). What a
figure against them means is the judge's (triage/judge/levels.py)."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

LevelKind = Literal["classification", "binary", "regression", "unknown"]


class LossLevels(BaseModel):
    model_config = ConfigDict(frozen=True)

    kind: LevelKind
    num_classes: Optional[int] = None
    chance: Optional[float] = Field(default=None, description="ln K, classifiers only.")
    constant: Optional[float] = Field(default=None, description="Loss of the best constant prediction.")
    floor: Optional[float] = Field(default=None, description="The least this loss can score: its value on a "
                                                              "perfect prediction, capped at 0; else unknown.")

    @property
    def nothing_learned(self) -> Optional[float]:
        """The loss of a model that learned nothing about its inputs: the best constant prediction (the
        label frequencies for a classifier, the mean target for a regressor), else ln K. A verified fix
        must end clearly below it (DESIGN §4: below chance, below predicting the mean)."""
        return self.constant if self.constant is not None else self.chance
