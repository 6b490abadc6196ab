"""The integrations are optional extras: `import triage` imports none of them, and a missing one says which
extra to install, in one line. One fresh interpreter checks it all (importing torch takes seconds)."""

import json
import subprocess
import sys

CHECK = """
import json, sys, tempfile, pathlib
import triage
found = {"imported": sorted(m for m in ("lightning", "pytorch_lightning", "transformers", "tensorboard")
                            if m in sys.modules)}
for name in ("lightning", "lightning.pytorch", "transformers", "tensorboard"):
    sys.modules[name] = None  # as if the extra were not installed
for module in ("triage.integrations.lightning", "triage.integrations.transformers"):
    try:
        __import__(module)
    except triage.TriageError as e:
        found[module] = str(e)
events = pathlib.Path(tempfile.mkdtemp()) / "events.out.tfevents.1.host"
events.write_bytes(b"")
from triage.load.history import read_history_file
try:
    read_history_file(events.parent)
except triage.TriageError as e:
    found["tensorboard"] = str(e)
print(json.dumps(found))
"""


def test_no_framework_is_imported_and_a_missing_extra_is_named():
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found.pop("imported") == []
    assert set(found) == {"triage.integrations.lightning", "triage.integrations.transformers", "tensorboard"}
    for key, extra in (("triage.integrations.lightning", "lightning"),
                       ("triage.integrations.transformers", "transformers"), ("tensorboard", "tensorboard")):
        assert f'pip install "torch-triage[{extra}]"' in found[key] and "\n" not in found[key]
