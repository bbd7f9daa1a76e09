"""The one RAM budget: a share of available memory, and the final prefetch within it."""

from tfopt.data.ram_budget import MAX_PREFETCH_BATCHES, prefetch_batches, ram_budget_bytes


def test_prefetch_is_bounded_by_its_share_of_the_budget():
    assert prefetch_batches(1_000, budget_bytes=125_000) == 10
    assert prefetch_batches(50_000, budget_bytes=125_000) == 1  # at least one batch, even over budget
    assert prefetch_batches(1_000, budget_bytes=10**12) == MAX_PREFETCH_BATCHES


def test_ram_budget_is_a_fraction_of_available_memory():
    assert 0 < ram_budget_bytes(0.01) < ram_budget_bytes(0.5)
    assert abs(ram_budget_bytes() - ram_budget_bytes(0.25)) < ram_budget_bytes(0.25) * 0.1
