import pytest

from tfopt.errors import MeasurementError
from tfopt.training.batch_search import BatchSizeSearch, Trial, search_batch_sizes

MIB = 2**20


def fake_trials(speed, memory_per_example=MIB, out_of_memory_from=None, calls=None):
    def run(batch_size):
        if calls is not None:
            calls.append(batch_size)
        if out_of_memory_from and batch_size >= out_of_memory_from:
            return Trial(batch_size, "out_of_memory")
        return Trial(
            batch_size,
            "ok",
            speed(batch_size),
            batch_size / speed(batch_size),
            100 * MIB + batch_size * memory_per_example,
        )

    return run


def test_stops_after_two_slower_sizes_and_refines_around_the_best():
    calls = []
    peak_at_64 = lambda n: 1000 - abs(64 - n)  # noqa: E731
    trials = search_batch_sizes(
        fake_trials(peak_at_64, calls=calls), min_batch_size=8, max_batch_size=4096, memory_budget_bytes=None
    )
    assert calls == [8, 16, 32, 64, 128, 256, 48, 96]
    search = BatchSizeSearch(tuple(trials), "host RSS", None)
    assert search.best_batch_size == 64


def test_beside_an_effective_batch_only_sizes_dividing_it_are_tried():
    """grad_accum's effective batch of 80 must be a multiple of the batch: the search doubles through its
    divisors (8, 16, then 40, as 32 does not divide it) and refines to the divisor nearest 3/4 of the best."""
    calls = []
    faster_with_size = lambda n: n  # noqa: E731
    search_batch_sizes(
        fake_trials(faster_with_size, calls=calls), min_batch_size=8, max_batch_size=40, memory_budget_bytes=None
    )
    assert calls == [8, 16, 32, 24]
    calls.clear()
    search_batch_sizes(
        fake_trials(faster_with_size, calls=calls),
        min_batch_size=8,
        max_batch_size=40,
        memory_budget_bytes=None,
        dividing=80,
    )
    assert calls == [8, 16, 40, 20]


@pytest.mark.parametrize("effective", [100, 36, 9])
def test_an_effective_batch_with_few_powers_of_two_still_gets_trials(effective):
    """Sizes that divide it but are no power of two (10, 20, 50 of 100; 3 of 9) are tried, never none."""
    from tfopt.recipes import BatchSize
    from tfopt.recipes.grad_accum import GradAccum

    adapted = BatchSize().beside([GradAccum(effective_batch_size=effective)])
    calls = []
    search_batch_sizes(
        fake_trials(lambda n: n, calls=calls),
        min_batch_size=adapted.min_batch_size,
        max_batch_size=adapted.max_batch_size,
        memory_budget_bytes=None,
        dividing=adapted.dividing,
    )
    assert calls and all(effective % size == 0 and effective // size >= 2 for size in calls)


def test_skips_a_size_predicted_over_budget_without_running_it():
    calls = []
    trials = search_batch_sizes(
        fake_trials(lambda n: n, calls=calls),
        min_batch_size=8,
        max_batch_size=4096,
        memory_budget_bytes=100 * MIB + 300 * MIB,
        baseline_bytes=100 * MIB,
    )
    assert calls == [8, 16, 32, 64, 128, 256, 192]  # 512 would need 612 MiB; 384 as well
    statuses = {trial.batch_size: trial.status for trial in trials}
    assert statuses[512] == "skipped" and statuses[384] == "skipped"
    assert BatchSizeSearch(tuple(trials), "host RSS", 400 * MIB).best_batch_size == 256


def test_out_of_memory_caps_the_refinement():
    trials = search_batch_sizes(
        fake_trials(lambda n: n, out_of_memory_from=200),
        min_batch_size=32,
        max_batch_size=4096,
        memory_budget_bytes=None,
    )
    assert [(trial.batch_size, trial.status) for trial in trials] == [
        (32, "ok"),
        (64, "ok"),
        (128, "ok"),
        (256, "out_of_memory"),
        (96, "ok"),
        (192, "ok"),
    ]


def test_max_batch_size_is_never_exceeded():
    trials = search_batch_sizes(fake_trials(lambda n: n), min_batch_size=8, max_batch_size=40, memory_budget_bytes=None)
    assert max(trial.batch_size for trial in trials) <= 40


def test_nothing_fits_says_what_to_change():
    search = BatchSizeSearch((Trial(8, "out_of_memory"),), "GPU memory", None)
    with pytest.raises(MeasurementError, match="Lower min_batch_size"):
        _ = search.best_batch_size


def test_markdown_table_marks_the_best():
    search = BatchSizeSearch(
        (
            Trial(8, "ok", 100.0, 0.08, 300 * MIB),
            Trial(16, "ok", 150.0, 0.1, 310 * MIB),
            Trial(32, "skipped", peak_memory_bytes=2**31),
        ),
        "host RSS",
        2**30,
    )
    table = search.to_markdown()
    assert "| 16 | 150 | 100.0 | 310 MiB | ok (best) |" in table and "| 32 | - | - | 2.0 GiB | skipped |" in table
