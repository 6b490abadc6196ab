"""The capture floor (DESIGN §6, below loading): the code that runs inside the user's training process.
It may import only the foundations (triage/*.py); loading reads the capture folders it writes.

The flight recorder: what a run keeps in memory so that, when it fails, a capture folder holds the
checkpoint from before the failure, the batches in flight, the history and a manifest.

    triggers.py   when to capture: a non-finite loss or gradient, a loss spike, a plateau
    memory.py     bounded in-memory state: CPU copies of the last good state, the last batches, the history
    manifest.py   the capture folder's manifest, and reading a capture back (load_batches)
    writer.py     writing a capture folder
    recorder.py   triage.Recorder for a plain loop (framework callbacks live in triage.integrations)
    save.py       triage.save_checkpoint: a checkpoint in the layout triage reads best
"""
