"""Which recipes auto mode tries, for faked hardware and diagnoses."""

from tests.conftest import FAKE_HARDWARE
from tfopt.auto.candidates import choose_candidates
from tfopt.profiling.breakdown import StepBreakdown
from tfopt.profiling.diagnose import diagnose_breakdown


def test_input_bound_bf16_cpu():
    chosen = choose_candidates(FAKE_HARDWARE["cpu_bf16"], input_efficiency=0.4)
    assert list(chosen.recipes) == ["data_pipeline", "mixed_bfloat16", "xla"]
    assert chosen.recipes["mixed_bfloat16"].policy == "mixed_bfloat16"
    assert chosen.recipes["xla"].jit_compile is True
    assert chosen.notes == ("baseline input efficiency: 40% of the on-device compute-only ceiling",)


def test_not_input_bound_plain_cpu_tries_only_xla():
    chosen = choose_candidates(FAKE_HARDWARE["cpu_plain"], input_efficiency=0.97)
    assert list(chosen.recipes) == ["xla"]
    assert chosen.not_tried["data_pipeline"] == ("not input-bound: real training reaches 97% of the compute-only "
                                                 "ceiling")
    assert "lacks bfloat16 instructions" in chosen.not_tried["mixed_precision"]


def test_v100_tries_float16():
    assert list(choose_candidates(FAKE_HARDWARE["v100"], input_efficiency=0.9).recipes) == ["mixed_float16", "xla"]


def test_diagnosis_decides_input_boundness_and_names_recipes_it_cannot_compare():
    starved = StepBreakdown(source="trace", hardware_type="GPU", step_seconds=(0.1,), input_seconds=0.01,
                            device_compute_seconds=0.02, other_seconds=0.07, device_busy_seconds=0.02,
                            xla_kernel_percent=100.0)
    diagnosis = diagnose_breakdown(starved, FAKE_HARDWARE["a100"])
    chosen = choose_candidates(FAKE_HARDWARE["a100"], input_efficiency=0.95, diagnosis=diagnosis)
    assert list(chosen.recipes) == ["data_pipeline", "mixed_bfloat16", "xla"]
    assert "changes the batch size" in chosen.not_tried["batch_size"]
    assert "input_bound (moderate, 10.0%) -> data_pipeline" in chosen.notes[0]
