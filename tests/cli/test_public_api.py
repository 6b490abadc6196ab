import triage


def test_the_public_surface_is_small_and_importable():
    assert sorted(triage.__all__) == sorted([
        "Setup", "run", "save_checkpoint", "Report", "Recorder", "RecorderSettings", "AutoTriage", "load_batches",
        "TriageError", "EntryError", "SetupError", "CheckpointError", "PlaybookError", "ReportError",
        "Interrupted", "Experiment", "Params", "Outcome", "Context", "Speedups",
    ])
    assert all(hasattr(triage, name) for name in triage.__all__)
    assert all(issubclass(getattr(triage, e), triage.TriageError)
               for e in ("EntryError", "SetupError", "CheckpointError", "PlaybookError", "ReportError"))
