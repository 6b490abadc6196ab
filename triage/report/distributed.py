"""What a report says about a distributed run: world size, backend, the model's wrapper, the launch."""

from __future__ import annotations

from typing import Any, Optional

from triage.load.ranks import current
from triage.load.wrappers import wrapper_of
from triage.report.model import DistributedInfo


def distributed_info(session: Any, command: str) -> Optional[DistributedInfo]:
    """None for a single process (no process group)."""
    ranks = current()
    if not ranks.distributed:
        return None
    return DistributedInfo(world_size=ranks.world_size, backend=ranks.backend or "?",
                           wrapper=wrapper_of(session.setup.model), launch=command,
                           rank_timeout_s=ranks.timeout_s, batches_per_rank=len(session.batches))
