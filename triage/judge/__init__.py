"""The judge: what triage decides, as pure functions of figures already measured.

Experiments measure (they train, and return an Outcome); the walk goes from node to node; the judge says
what the figures mean: whether a counterfactual's fix works (fix.py, DESIGN §4) and which level a loss
must end below (levels.py), whether a fix that is not verified yet deserves more steps (extension.py),
which candidate of a differential wins and how sure that is (differential.py), how far weight decay
can have shrunk the weights (decay.py), the symptom rules a playbook calls by name, `stalls(baseline)`
(named.py), when a search over the LR or the init stops and which trial it chooses (search.py), and what
a run's own loss log says (history.py, for `triage read-history`).
A change to "what counts as fixed" is made here and nowhere else: an experiment measures a counterfactual
and its reference over the same steps, and the walk asks the judge whether the fix works (walk/engine.py,
experiments/verify.judged). It imports only the foundation (and torch, to read an optimizer's settings): no
experiment, no walk, no report.
"""
