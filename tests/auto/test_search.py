"""The greedy search with faked trials and a faked clock: order, combination, failures and the budget."""

import pytest

from tfopt.auto.decide import TrialResult
from tfopt.auto.search import search
from tfopt.errors import MeasurementError
from tfopt.profiling.timing import StepTimes

LOSSES = (2.0, 1.8, 1.6)
BATCH = 10


class FakeMachine:
    """Returns a preset trial per configuration and advances a fake clock by each trial's cost."""

    def __init__(self, step_seconds, *, trial_seconds=10.0, losses=None, errors=(), baseline=(0.1, 0.1)):
        self.step_seconds, self.trial_seconds = step_seconds, trial_seconds
        self.losses, self.errors = losses or {}, set(errors)
        self.baseline = list(baseline)
        self.now = 0.0
        self.runs = []

    def clock(self):
        return self.now

    def __call__(self, configuration, deadline):
        self.runs.append(configuration)
        self.now += self.trial_seconds
        if configuration in self.errors:
            raise RuntimeError(f"{' + '.join(configuration)} does not build")
        seconds = self.baseline.pop(0) if not configuration else self.step_seconds[configuration]
        return TrialResult(
            configuration,
            StepTimes((seconds,) * 8, BATCH),
            compile_seconds=1.0,
            losses=self.losses.get(configuration, LOSSES),
            wall_seconds=self.trial_seconds,
        )


def run_search(machine, candidates, budget=1000.0, **kwargs):
    return search(candidates, machine, budget_seconds=budget, clock=machine.clock, **kwargs)


def decisions(table):
    return {decision.candidate: (decision.kept, decision.reason) for decision in table.decisions}


def test_order_and_greedy_combination():
    machine = FakeMachine(
        {("data",): 0.05, ("bf16",): 0.08, ("xla",): 0.2, ("data", "bf16"): 0.03, ("data", "bf16", "xla"): 0.06}
    )
    table = run_search(machine, ["data", "bf16", "xla"])
    # baseline, each alone, baseline again, then on top of the best (data): bf16 (faster alone), then xla.
    assert machine.runs == [(), ("data",), ("bf16",), ("xla",), (), ("data", "bf16"), ("data", "bf16", "xla")]
    assert table.chosen == ("data", "bf16")
    assert table.baseline_examples_per_second == pytest.approx(100.0)
    assert table.noise_fraction == pytest.approx(0.03)  # identical baseline runs: the floor
    assert [row.configuration for row in table.rows] == [
        "baseline",
        "data",
        "bf16",
        "xla",
        "baseline",
        "data + bf16",
        "data + bf16 + xla",
    ]
    assert [row.status for row in table.rows] == [
        "baseline",
        "kept",
        "kept",
        "rejected",
        "baseline",
        "kept",
        "rejected",
    ]
    assert table.rows[5].ratio == pytest.approx(0.1 / 0.03)  # against the baseline
    assert "kept: 1.67x data" in table.rows[5].reason  # against the best so far
    assert table.chosen_examples_per_second == pytest.approx(BATCH / 0.03)
    kept = decisions(table)
    assert kept["data"][0] and kept["bf16"][0] and not kept["xla"][0]
    assert kept["xla"][1] == "on top of data + bf16: rejected: 0.50x data + bf16 on this machine (noise 3%)"
    assert table.rows[3].reason == "rejected: 0.50x baseline on this machine (noise 3%)"


def test_settings_of_one_recipe_are_never_combined():
    """data_service with 1 or 2 workers: both tried alone, the faster kept, the other not combined with it."""
    machine = FakeMachine({("data",): 0.05, ("svc:1",): 0.04, ("svc:2",): 0.045, ("data", "svc:1"): 0.03})
    table = run_search(machine, ["data", "svc:1", "svc:2"], alternatives={"svc:1": "svc", "svc:2": "svc"})
    assert machine.runs == [(), ("data",), ("svc:1",), ("svc:2",), (), ("data", "svc:1")]
    assert table.chosen == ("data", "svc:1")
    assert decisions(table)["svc:2"] == (False, "another setting of svc, svc:1, was chosen")


def test_slower_alone_is_still_tried_on_top_of_the_pipeline_fix():
    # Input-bound: bf16 alone cannot show its gain, it does once the pipeline is fixed.
    machine = FakeMachine({("data",): 0.05, ("bf16",): 0.104, ("data", "bf16"): 0.035})
    table = run_search(machine, ["data", "bf16"])
    assert table.chosen == ("data", "bf16")
    assert table.rows[2].status == "rejected"


def test_tie_keeps_the_simpler_configuration():
    machine = FakeMachine({("data",): 0.05, ("bf16",): 0.099, ("data", "bf16"): 0.049})
    table = run_search(machine, ["data", "bf16"])
    assert table.chosen == ("data",)
    assert decisions(table)["bf16"] == (False, "on top of data: rejected: 1.02x data is within the noise (3%)")


def test_noise_from_the_baseline_repeat_decides_ties():
    # The baseline's two runs differ by 10%, so an 8% gain is noise.
    machine = FakeMachine({("bf16",): 0.097}, baseline=(0.1, 0.11))  # 1.08x the baseline mean
    table = run_search(machine, ["bf16"])
    assert table.noise_fraction == pytest.approx(0.1)
    assert table.chosen == ()
    assert table.rows[1].reason.endswith("within the noise (10%)")


def test_broken_numerics_are_never_kept_nor_combined():
    machine = FakeMachine({("data",): 0.05, ("fp16",): 0.02}, losses={("fp16",): (2.0, float("nan"), float("nan"))})
    table = run_search(machine, ["data", "fp16"])
    assert table.chosen == ("data",)
    assert ("data", "fp16") not in machine.runs
    assert "loss is not finite" in decisions(table)["fp16"][1]
    assert table.best_row.configuration == "data"  # the faster fp16 row does not count


def test_a_candidate_that_raises_is_rejected_and_the_search_goes_on():
    machine = FakeMachine({("data",): 0.05}, errors={("xla",)})
    table = run_search(machine, ["xla", "data"])
    assert table.chosen == ("data",)
    assert table.rows[1].status == "failed"
    assert decisions(table)["xla"] == (False, "failed: RuntimeError: xla does not build")


def test_a_baseline_that_cannot_train_is_an_error():
    machine = FakeMachine({}, errors={()})
    with pytest.raises(MeasurementError, match=r"could not measure the baseline.*does not build"):
        run_search(machine, ["data"])


def test_budget_exhaustion_skips_trials_and_keeps_the_budget():
    machine = FakeMachine({("data",): 0.05, ("bf16",): 0.08, ("xla",): 0.09}, trial_seconds=10.0)
    table = run_search(machine, ["data", "bf16", "xla"], budget=45.0)
    # 10 s per trial: baseline, data, bf16 fit with the baseline's repeat still reserved; xla does not.
    assert machine.runs == [(), ("data",), ("bf16",), ()]
    assert machine.now <= 45.0 and table.elapsed_seconds == 40.0
    statuses = {row.configuration: row.status for row in table.rows}
    assert statuses["xla"] == "not run" and statuses["data + bf16"] == "not run"
    assert table.chosen == ("data",)
    assert decisions(table)["bf16"] == (
        False,
        "faster alone: 1.25x baseline, same numerics; not combined: the time budget ran out",
    )


def test_progress_events_cover_every_trial():
    events = []
    machine = FakeMachine({("data",): 0.05})
    run_search(machine, ["data"], on_progress=events.append)
    assert [event.message for event in events] == [
        "trial 1: baseline",
        "baseline: 100.0 examples/s",
        "trial 2: data",
        "data: 200.0 examples/s",
        "trial 3: baseline",
        "baseline: 100.0 examples/s",
        "chose data",
    ]
    assert events[-1].elapsed_seconds == 30.0 and events[-1].trials_done == 3 == events[-1].trials_planned


def test_not_tried_candidates_get_rows_and_decisions():
    machine = FakeMachine({})
    table = run_search(machine, [], not_tried={"data_pipeline": "not input-bound"}, notes=("diagnosis: none",))
    assert machine.runs == [(), ()]
    assert table.rows[-1].status == "not tried"
    assert decisions(table) == {"data_pipeline": (False, "not tried: not input-bound")}
    assert table.notes == ("diagnosis: none",)
