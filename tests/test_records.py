"""TrialRecord is the trials.parquet schema; trials.jsonl and Parquet are its only dict edges."""
from __future__ import annotations

import dataclasses
import json

import pyarrow as pa

from farm.bundle import artifacts, signing
from farm.bundle.records import SCHEMA, TrialRecord
from farm.measure import outcomes
from farm.measure.outcomes import Measurement
from farm.run import runlog
from farm.tasks import TuningTask

TASK = TuningTask("softmax", (64, 256), "float32", "interpret")


def test_the_parquet_schema_is_the_records_fields():
    # trials.parquet: the record's fields, then the typed knobs derived from its config
    assert artifacts.TRIAL_COLUMNS.names == [*SCHEMA.names, "knobs"]
    assert artifacts.TRIAL_COLUMNS.remove(artifacts.TRIAL_COLUMNS.get_field_index("knobs")) == SCHEMA
    assert SCHEMA.names == [f.name for f in dataclasses.fields(TrialRecord)]
    assert SCHEMA.field("started").type == SCHEMA.field("finished").type == pa.timestamp("us", tz="UTC")
    assert SCHEMA.field("shape").type == pa.list_(pa.int64())
    assert SCHEMA.field("median_s").type == pa.float64() and SCHEMA.field("trial").type == pa.int64()
    assert all(SCHEMA.field(name).nullable for name in SCHEMA.names)


def test_every_measurement_field_is_a_record_field():
    names = {f.name for f in dataclasses.fields(TrialRecord)}
    assert {f.name for f in dataclasses.fields(Measurement)} <= names


def test_records_round_trip_through_the_log_and_the_bundle(tmp_path, signing_key):
    measured = TrialRecord.measured(TASK, 3, '{"block_rows":8}', Measurement(outcomes.OK, median_s=1e-4, n_timed=5),
                                    device_s=0.5, attempt=2, run_id="r")
    pruned = TrialRecord.for_task(TASK, 4, '{"block_rows":512}', outcomes.PRUNED, error="too big",
                                  footprint_bytes=10, capacity_bytes=5)
    with runlog.RunLog(tmp_path) as log:
        log.append(measured)
        log.append(pruned)
    with (tmp_path / runlog.TRIALS_LOG).open("a") as f:
        f.write('{"task_key": "torn')   # a driver killed mid-line
    assert runlog.replay(tmp_path) == [measured, pruned]
    bundle = artifacts.write_bundle(tmp_path / "bundle", [], [measured, pruned],
                                    signing.load_private_key(signing_key[0]))
    rows = artifacts.read_trials(bundle).to_pylist()
    assert [TrialRecord.from_dict(r) for r in rows] == [measured, pruned]


def test_older_log_lines_still_read():
    line = {"task_key": TASK.key, "kernel": "softmax", "shape": [64, 256], "dtype": "float32", "target": "interpret",
            "trial": 0, "config": "{}", "outcome": "invalid", "error": "breaks constraint", "attempt": 1,
            "finished": "2026-01-01T00:00:00+00:00", "elapsed_s": 0.1, "run_id": "old", "unknown_field": 1}
    record = TrialRecord.from_dict(json.loads(json.dumps(line)))
    assert record.shape == (64, 256) and record.requeued == 0 and record.median_s is None


def test_bundle_tables_are_typed_for_sql_and_dataframes(tmp_path):
    """DuckDB (as pandas and Polars would) reads knobs and times with the types Parquet carries."""
    import duckdb

    from tests import bundles as B

    row = B.row("softmax", (64, 256), {"block_rows": 16, "strategy": "one_pass"})
    private, _ = B.keypair(tmp_path / "keys", "ci")
    folder = B.write(tmp_path / "bundle", [row], private)
    knobs = duckdb.sql(f"SELECT k.name, k.int, k.string FROM '{folder / artifacts.CONFIGS}', "
                       f"UNNEST(knobs) AS t(k) ORDER BY k.name").fetchall()
    assert knobs == [("block_rows", 16, None), ("strategy", None, "one_pass")]
    created = duckdb.sql(f"SELECT created FROM '{folder / artifacts.CONFIGS}'").fetchall()[0][0]
    assert created.year == 2025 and created.tzinfo is not None
    started = duckdb.sql(f"SELECT typeof(started), typeof(knobs) FROM '{folder / artifacts.TRIALS}'").fetchall()[0]
    assert started[0].startswith("TIMESTAMP") and started[1].startswith("STRUCT")


def test_a_task_without_a_valid_config_is_told_by_its_commonest_failure():
    """The outcome most failures share, then its commonest message with the numbers that differ
    config by config (relative errors, sizes) left out of the comparison."""
    from farm.run.report import common_failure

    task = TuningTask("softmax", (8, 128), "float32", "interpret")

    def failed(outcome: str, error: str) -> TrialRecord:
        return TrialRecord.measured(task, 0, "{}", Measurement(outcome, error=error))

    records = [failed(outcomes.WRONG_RESULT, f"relative error {e} exceeds the float32 tolerance 0.002")
               for e in (0.41, 0.52, 0.6, 1.3e-2)]
    records += [failed(outcomes.COMPILE_ERROR, "ValueError: lowering failed")] * 3
    records.append(TrialRecord.measured(task, 1, "{}", Measurement(outcomes.OK, median_s=1e-3)))
    shared = common_failure(records)
    assert shared is not None and (shared.count, shared.failed) == (4, 7)
    assert shared.message == "wrong_result: relative error 0.41 exceeds the float32 tolerance 0.002"
    assert common_failure(records[-1:]) is None
