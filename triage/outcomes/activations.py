"""What activation_health measures: dead rectifier units, saturated sigmoid/tanh outputs, and how the
spread of activations grows with depth (triage/experiments/activations.py)."""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from triage.outcomes.base import Outcome


class LayerHealth(Outcome):
    name: str = Field(
        description='Module name; a module called again in one forward is "name#2", ...',
        json_schema_extra={"words": "name"})
    kind: str = Field(description="Its class: ReLU, GELU, Sigmoid, ...", json_schema_extra={"words": "kind"})
    units: int = Field(json_schema_extra={"words": "units"})
    dead_fraction: Optional[float] = Field(
        default=None, description="Rectifiers: units never > 0.",
        json_schema_extra={"words": "dead units", "unit": "%"})
    saturated_fraction: Optional[float] = Field(
        default=None, description="Sigmoid/tanh: outputs saturated.",
        json_schema_extra={"words": "saturated share", "unit": "%"})
    std: float = Field(description="Standard deviation of all its outputs.", json_schema_extra={"words": "std"})


class ActivationOutcome(Outcome):
    batches_checked: int = Field(json_schema_extra={"words": "batches checked"})
    layers: list[LayerHealth] = Field(description="In the order they first ran.", json_schema_extra={"words": "layers"})
    hooked_layers: int = Field(json_schema_extra={"words": "hooked layers"})
    relu_layers: int = Field(description="Rectifier (ReLU-family) layers.", json_schema_extra={"words": "ReLU layers"})
    max_dead_fraction: Optional[float] = Field(default=None, json_schema_extra={"words": "max dead share", "unit": "%"})
    mean_dead_fraction: Optional[float] = Field(
        default=None, description="Over rectifier layers, unit-weighted.",
        json_schema_extra={"words": "mean dead share", "unit": "%"})
    worst_layer: Optional[str] = Field(
        default=None, description="The rectifier with most dead units; without rectifiers, the most saturated.",
        json_schema_extra={"words": "worst layer"})
    worst_layer_type: Optional[str] = Field(
        default=None, description="Its class: ReLU, Sigmoid, ...",
        json_schema_extra={"words": "worst layer type"})
    worst_layer_previous: Optional[str] = Field(
        default=None, description="Where it is an nn.Sequential's bare index (`3`): the layer run before it.",
        json_schema_extra={"words": "worst layer previous"})
    worst_layer_previous_type: Optional[str] = Field(
        default=None, json_schema_extra={"words": "worst layer previous type"})
    max_saturated_fraction: Optional[float] = Field(
        default=None, json_schema_extra={"words": "max saturated share", "unit": "%"})
    std_growth: Optional[float] = Field(
        default=None, description="std of the last layer / std of the first.",
        json_schema_extra={"words": "std growth", "unit": "×"})
