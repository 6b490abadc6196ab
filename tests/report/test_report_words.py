"""Figures in words: every field an experiment measures has an entry in the one table of labels
(report/labels.py) that report.html and summary.md both read; summary.md names no field; the walked
path folds the checks that found nothing under one line."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import triage.experiments as experiments
from tests.report.test_report_render import pipeline_report
from triage.experiments.base import Outcome
from triage.report.render import render_html, render_markdown
from triage.report.labels import LABELS, condition_words, value, words


def outcome_fields() -> set[str]:
    fields = set()
    for module in pkgutil.iter_modules(experiments.__path__):
        for _, cls in inspect.getmembers(importlib.import_module(f"triage.experiments.{module.name}"), inspect.isclass):
            if issubclass(cls, Outcome):
                fields |= set(cls.model_fields)
    return fields


def test_every_field_an_experiment_measures_has_a_label():
    missing = sorted(f for f in outcome_fields() if f not in LABELS)
    assert missing == []
    assert all(entry[0] and "_" not in entry[0] for entry in LABELS.values())  # words, not names


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
