import pytest
import torch

# Tiny models run several times faster on one thread than on two contended ones.
torch.set_num_threads(1)

# The modules that hold about three quarters of the suite's time (seconds of test time each, measured with
# --durations=0 on 2026-11-28, 479 s in all): end-to-end walks of the zoo and of the real programs, torchrun
# runs, the watcher's processes, suite and scale benchmark samples, hostile inputs. They are marked `slow`;
# `python -m pytest -q -n 2 -m "not slow"` runs the rest, the fast subset, while you work.
SLOW_MODULES = {
    "test_e2e_zoo.py": 96, "test_distributed.py": 56, "test_programs_benchmark.py": 54, "test_watch.py": 36,
    "test_suite.py": 32, "test_scale_benchmark.py": 31, "test_hostile_loading.py": 24,
    "test_hostile_inputs.py": 23, "test_every_optimizer_and_scheduler.py": 18,
}


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: in a module that runs whole walks or processes (tests/conftest.py)")


def pytest_collection_modifyitems(items):
    for item in items:
        if item.path.name in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
