"""Which configs a task's winner is chosen among (`farm.bundle.select`)."""
from __future__ import annotations

import dataclasses

from farm.bundle import select
from farm.bundle.records import TrialRecord
from farm.tasks import TuningTask

TASK = TuningTask("matmul", (256, 256, 256), "bfloat16", "gpu-mosaic")


def _records(medians: list[float | None]) -> list[TrialRecord]:
    out = []
    for i, median in enumerate(medians):
        r = TrialRecord.for_task(TASK, i, f'{{"block_m":{16 * (i + 1)}}}', "ok" if median else "oom")
        out.append(dataclasses.replace(r, median_s=median, spread=0.01 if median else None))
    return out


def test_finalists_are_the_fastest_and_every_near_tie_up_to_twice_their_count():
    # 4 fastest, then 3 more within 5% of the best (the sweep cannot order them), then a clear loser
    records = _records([1.00, 1.01, 1.02, 1.03, 1.04, 1.045, 1.049, 1.2, None])
    chosen = select.finalists(records, 4)
    assert chosen == [r.config for r in records[:7]]
    assert len(select.finalists(_records([1.0] * 12), 4)) == 8  # at most twice the count
    assert select.finalists(records, 4, near=0.0) == [r.config for r in records[:4]]
    assert select.finalists(records, 0) == []


def test_the_default_joins_the_finalists_when_it_ran():
    records = _records([1.0, 1.5, 2.0])
    assert select.finalists(records, 1, default=records[2].config) == [records[0].config, records[2].config]
    assert select.finalists(records[:2], 1, default='{"block_m":999}') == [records[0].config]
