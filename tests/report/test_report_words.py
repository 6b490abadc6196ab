"""Figures in words: every field a shipped experiment measures is named by the words its model declares
beside it, gathered into the one table of labels (report/labels.py) that report.html and summary.md both
read; one name is never named two ways; a figure's meaning is its own experiment's; summary.md names no
field; the walked path folds the checks that found nothing under one line."""

from __future__ import annotations

import re
from typing import Optional

import pytest
from pydantic import BaseModel, Field

import triage.outcomes as outcomes
from tests.outcomes.test_outcome_models import models_in
from tests.report.test_report_render import pipeline_report
from triage.report.labels import LABELS, condition_words, meaning, table, value, words
from triage.report.render import render_html, render_markdown


def outcome_fields() -> set[str]:
    return {name for model in models_in(outcomes) for name in model.model_fields}


def test_every_field_an_experiment_measures_has_a_label():
    missing = sorted(f for f in outcome_fields() if f not in LABELS)
    assert missing == []
    assert all(entry.words and "_" not in entry.words for entry in LABELS.values())  # words, not names
    assert words("baseline.status", "divergence") == "how it ended (baseline)"  # the run's own fact, from records


class _Scan(BaseModel):
    worst: Optional[float] = Field(default=None, description="The worst batch.",
                                   json_schema_extra={"words": "worst batch"})


class _Other(BaseModel):
    worst: Optional[float] = Field(default=None, description="The worst layer.",
                                   json_schema_extra={"words": "worst layer"})


class _Held(BaseModel):
    rows: list[_Other] = Field(default_factory=list, json_schema_extra={"words": "rows"})


def test_one_field_name_named_two_ways_is_an_error():
    with pytest.raises(ValueError, match=r"'worst'.*'worst batch'.*_Scan.*'worst layer'.*_Other"):
        table([_Scan, _Held])  # _Other's fields count too: it is held in _Held.rows


def test_a_figure_means_what_its_own_experiment_says():
    assert meaning("losses", "batch_scan") == "Loss of each snapshot batch at the checkpoint's weights."
    assert meaning("losses", "replay") == "Training loss per step."
    assert meaning("truncated", "locate_nonfinite") != meaning("truncated", "replay")
    assert meaning("losses", "my_own_probe") == ""  # a playbook's own: described two ways, so not at all
    assert meaning("loss_ratio", "my_own_probe") == meaning("loss_ratio", "replay") != ""


def test_a_figure_is_shown_in_words_with_its_unit():
    assert words("baseline.max_rise", "divergence") == "largest rise of the loss (baseline)"
    assert words("baseline.max_rise", "baseline") == "largest rise of the loss"
    assert value("clipped_fraction", 0.925) == "92.5%" and value("loss_ratio", 1.448) == "1.448×"
    assert condition_words("baseline.loss_ratio > 1.5", "baseline") == "loss end / start > 1.5"


def test_summary_and_page_name_figures_in_words():
    report = pipeline_report(0.5)
    fields = {f for f in outcome_fields() if "_" in f} - {e.node for e in report.experiments} \
        - {e.experiment for e in report.experiments} - {n.id for n in report.flowchart.nodes}
    summary = render_markdown(report).replace("\\_", "_")
    prose = summary.split("**Path:**")[0]  # the path and the experiments table name nodes, which may hold _
    assert sorted(f for f in fields if re.search(rf"\b{f}\b", prose)) == []
    page = render_html(report)
    figures = re.findall(r'<span class="k">([^<]*)</span>', page)
    assert figures and not [f for f in figures if "_" in f]


def test_the_checks_that_found_nothing_fold_under_one_line():
    report = pipeline_report(0.5)
    page = render_html(report)
    quiet = re.findall(r'<li class="quiet"><details><summary>(\d+) checks found nothing: ([^<]*)</summary>', page)
    assert quiet, "no quiet run folded"
    folded = {n for _, names in quiet for n in names.split(", ")}
    held = {d.node for d in report.decisions if d.when is not None}
    assert folded and not folded & held  # a step that found something is never folded away
    assert sum(int(n) for n, _ in quiet) == len(folded)
