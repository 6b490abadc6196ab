"""Triage without a person: `triage watch` (a sidecar that triages each finished capture) and
`triage read-history` (a log-only reading of a loss curve, for a CI gate).

    sidecar.py   the watch loop: finished captures, one `triage run` child at a time, the report in DIR-reports/<capture>
    state.py     what was done, kept across restarts (atomic JSON, per-capture locks)
    hook.py      --then: the user's command, with the verdict in its environment
    reading.py   read-history: the symptom of a loss log and the step it started
"""
