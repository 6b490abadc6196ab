"""The one registry of experiments by name. Playbooks are checked against it before anything runs."""

from __future__ import annotations

from typing import Iterable, Iterator

from triage.experiments.base import Experiment
from triage.views import check_views


class Registry:
    def __init__(self, experiments: Iterable[Experiment] = ()) -> None:
        self._by_name: dict[str, Experiment] = {}
        for experiment in experiments:
            self.register(experiment)

    def register(self, experiment: Experiment) -> Experiment:
        """Add `experiment`. Raises ValueError when the name is taken, and triage.views.ViewError (a
        ValueError) when one of its views names a field its Outcome model does not have."""
        check_views(experiment.name, experiment.views, experiment.outcome)
        if experiment.name in self._by_name:
            raise ValueError(f"an experiment named '{experiment.name}' is already registered")
        self._by_name[experiment.name] = experiment
        return experiment

    def get(self, name: str) -> Experiment | None:
        return self._by_name.get(name)

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def __iter__(self) -> Iterator[Experiment]:
        return iter(self._by_name.values())

    def copy(self) -> "Registry":
        return Registry(self._by_name.values())
