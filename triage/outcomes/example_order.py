"""What example_order measures: whether the run's loss depends on the order of the examples in a batch
(triage/experiments/example_order.py)."""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from triage.outcomes.base import Outcome


class ExampleOrderOutcome(Outcome):
    compared: int = Field(
        default=0, description="Batches scored in their own order and with their examples in reverse order.",
        json_schema_extra={"words": "batches compared"})
    not_compared: Optional[str] = Field(
        default=None, description="Why no batch was compared (examples that are not rows, a batch sorted by one "
                                  "of its tensors, a loss that mixes examples before the model, or raised).",
        json_schema_extra={"words": "not compared"})
    loss_gap: Optional[float] = Field(
        default=None, description="The largest |loss reversed - loss as given| / |loss as given| over the batches "
                                  "compared: about 1e-6 (float summation order) for a loss over a set of examples.",
        json_schema_extra={"words": "loss change with the order", "unit": "%"})
    draw_gap: Optional[float] = Field(
        default=None, description="The largest |loss - loss| / |loss| between two scorings of a batch in its own "
                                  "order under two random seeds (random negatives or masks drawn inside the loss): "
                                  "0 for a loss that draws nothing.",
        json_schema_extra={"words": "loss change between random draws", "unit": "%"})
    outputs_follow: Optional[bool] = Field(
        default=None, description="Reversing the examples reversed the model's output row for row (each example's "
                                  "output its own): False where the forward pairs parts of different examples by "
                                  "their place in the batch.",
        json_schema_extra={"words": "outputs follow their examples"})
