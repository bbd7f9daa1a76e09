"""The trials table: its JSON form, its renderings, and which row counts as the best."""

import json

import pytest

from tfopt.auto.table import Decision, TrialRow, TrialsTable

ROWS = (
    TrialRow("baseline", "baseline", "baseline", "baseline: first run", 100.0, 10.0, 1.0, 0.1, 2.5),
    TrialRow(
        "mixed_bfloat16",
        "alone",
        "kept",
        "kept: 1.50x baseline, loss within 0.68%",
        150.0,
        12.0,
        1.5,
        0.0667,
        1.1,
        0.0068,
    ),
    TrialRow(
        "mixed_float16",
        "alone",
        "rejected",
        "rejected: loss is not finite (tolerance 2%)",
        300.0,
        5.0,
        3.0,
        0.033,
        1.0,
        float("inf"),
    ),
    TrialRow(
        "xla",
        "alone",
        "rejected",
        "rejected: 0.52x baseline on this machine (noise 3%)",
        52.0,
        4.0,
        0.52,
        0.19,
        7.5,
        0.002,
    ),
    TrialRow("baseline", "baseline", "baseline", "baseline: repeat; noise 3%", 100.0, 9.0, 1.0, 0.1, None),
    TrialRow("data_pipeline", "candidate", "not tried", "not input-bound"),
)


def table():
    return TrialsTable(
        rows=ROWS,
        decisions=(
            Decision("mixed_bfloat16", True, "kept: 1.50x baseline"),
            Decision("xla", False, "rejected: 0.52x baseline on this machine"),
        ),
        chosen=("mixed_bfloat16",),
        baseline_examples_per_second=100.0,
        noise_fraction=0.03,
        loss_tolerance=0.02,
        budget_seconds=120.0,
        elapsed_seconds=97.0,
        notes=("diagnosis: x",),
    )


def test_chosen_and_best_ignore_broken_numerics():
    result = table()
    assert result.chosen_label == "mixed_bfloat16" and result.chosen_examples_per_second == 150.0
    assert result.best_row.configuration == "mixed_bfloat16"  # fp16's 300/s broke the loss
    assert result.best_examples_per_second == 150.0


def test_to_dict_is_json_safe_and_complete():
    data = json.loads(json.dumps(table().to_dict(), allow_nan=True))
    assert [row["configuration"] for row in data["rows"]][:2] == ["baseline", "mixed_bfloat16"]
    assert data["chosen"] == ["mixed_bfloat16"] and data["noise_fraction"] == 0.03
    assert data["decisions"][1] == {
        "candidate": "xla",
        "kept": False,
        "reason": "rejected: 0.52x baseline on this machine",
    }


def test_markdown_rows():
    lines = table().to_markdown().splitlines()
    assert lines[0] == "| configuration | examples/s | vs baseline | step ms | compile s | loss diff | result |"
    assert lines[3] == (
        "| mixed_bfloat16 | 150.0 ± 6.0 | 1.50x | 66.7 | 1.10 | 0.68% | kept: 1.50x baseline, loss within 0.68% |"
    )
    assert lines[6] == "| baseline | 100.0 ± 4.5 | 1.00x | 100.0 | shared |  | baseline: repeat; noise 3% |"
    assert lines[7] == "| data_pipeline |  |  |  |  |  | not tried: not input-bound |"
    assert "- xla: rejected: 0.52x baseline on this machine" in lines
    assert lines[9].startswith("Chosen: mixed_bfloat16 at 150.0 examples/s (1.50x baseline). Noise 3%")


def test_text_is_aligned():
    lines = table().to_text().splitlines()
    column = lines[0].index("examples/s")
    assert all(line[column - 2 : column] == "  " for line in lines[1:7])
    assert str(table()) == table().to_text()


def test_unknown_status_is_rejected():
    with pytest.raises(ValueError, match="status 'maybe' is not one of"):
        TrialRow("xla", "alone", "maybe", "")
