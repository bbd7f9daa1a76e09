"""Which recipes auto mode tries, for faked hardware and diagnoses."""

from tests.conftest import FAKE_HARDWARE
from tfopt.auto.candidates import choose_candidates
from tfopt.profiling.breakdown import StepBreakdown
from tfopt.profiling.diagnose import diagnose_breakdown
from tfopt.profiling.hotspots import Hotspots
from tfopt.profiling.stages import PipelineStages


def test_input_bound_bf16_cpu():
    chosen = choose_candidates(FAKE_HARDWARE["cpu_bf16"], input_efficiency=0.4)
    assert list(chosen.recipes) == ["data_pipeline", "mixed_bfloat16", "xla"]
    assert chosen.recipes["mixed_bfloat16"].policy == "mixed_bfloat16"
    assert chosen.recipes["xla"].jit_compile is True
    assert chosen.notes == ("baseline input efficiency: 40% of the on-device compute-only ceiling",)


def test_not_input_bound_plain_cpu_tries_only_xla():
    chosen = choose_candidates(FAKE_HARDWARE["cpu_plain"], input_efficiency=0.97)
    assert list(chosen.recipes) == ["xla"]
    assert chosen.not_tried["data_pipeline"] == (
        "not input-bound: real training reaches 97% of the compute-only ceiling"
    )
    assert "lacks bfloat16 instructions" in chosen.not_tried["mixed_precision"]


def test_batch_norms_the_fused_kernel_computes_make_fused_layers_a_candidate():
    chosen = choose_candidates(FAKE_HARDWARE["cpu_plain"], input_efficiency=0.97, fusable_batch_norms=3)
    assert list(chosen.recipes) == ["xla", "fused_layers"]
    assert chosen.recipes["fused_layers"].get_config() == {"batch_norm": True, "conv_bias": True}  # trials decide
    assert (
        "no BatchNormalization layer"
        in choose_candidates(FAKE_HARDWARE["cpu_plain"], input_efficiency=0.97).not_tried["fused_layers"]
    )


def test_v100_tries_float16():
    assert list(choose_candidates(FAKE_HARDWARE["v100"], input_efficiency=0.9).recipes) == ["mixed_float16", "xla"]


def test_diagnosis_decides_input_boundness_and_names_recipes_it_cannot_compare():
    starved = StepBreakdown(
        source="trace",
        hardware_type="GPU",
        step_seconds=(0.1,),
        input_seconds=0.01,
        device_compute_seconds=0.02,
        other_seconds=0.07,
        device_busy_seconds=0.02,
        xla_kernel_percent=100.0,
    )
    diagnosis = diagnose_breakdown(starved, FAKE_HARDWARE["a100"])
    chosen = choose_candidates(FAKE_HARDWARE["a100"], input_efficiency=0.95, diagnosis=diagnosis)
    assert list(chosen.recipes) == ["data_pipeline", "mixed_bfloat16", "xla"]
    assert "the loss trajectory is not compared step by step" in chosen.not_tried["steps_per_execution"]
    assert "input_bound (moderate, 10.0%) -> data_pipeline" in chosen.notes[0]
    called = diagnose_breakdown(starved, FAKE_HARDWARE["a100"], steps_per_call=4)  # then a larger batch is next
    chosen = choose_candidates(FAKE_HARDWARE["a100"], input_efficiency=0.95, diagnosis=called)
    assert "changes the batch size" in chosen.not_tried["batch_size"]


def test_a_parallel_pipeline_on_a_saturated_host_tries_local_service_workers():
    """The stage table's "the host is the limit" (its recipe data_service) makes worker counts candidates: one
    on a 2-core host, one and two from 4 cores on, settings of one recipe that search never combines."""
    import dataclasses

    starved = StepBreakdown(
        source="trace",
        hardware_type="GPU",
        step_seconds=(0.1,),
        input_seconds=0.04,
        device_compute_seconds=0.02,
        other_seconds=0.04,
        device_busy_seconds=0.02,
        xla_kernel_percent=100.0,
    )
    diagnosis = diagnose_breakdown(starved, FAKE_HARDWARE["a100"])
    host_limited = PipelineStages(
        stages=(),
        batches=4,
        cpu_count=16,
        bottleneck=None,
        margin=None,
        host_limited=True,
        recipe="data_service",
        fix="the host is the limit",
        notes=(),
    )
    offload = dataclasses.replace(diagnosis, hotspots=Hotspots(stages=host_limited, layers=None))
    two_cores = dataclasses.replace(FAKE_HARDWARE["cpu_bf16"], cpu_count=2)
    chosen = choose_candidates(two_cores, input_efficiency=0.5, diagnosis=offload)
    assert [label for label in chosen.recipes if label.startswith("data_service")] == ["data_service:1"]
    assert chosen.recipes["data_service:1"].workers == 1 and chosen.alternatives == {}
    many = choose_candidates(dataclasses.replace(two_cores, cpu_count=16), input_efficiency=0.5, diagnosis=offload)
    assert [many.recipes[f"data_service:{n}"].workers for n in (1, 2)] == [1, 2]
    assert many.alternatives == {"data_service:1": "data_service", "data_service:2": "data_service"}
    plain = choose_candidates(two_cores, input_efficiency=0.5, diagnosis=diagnosis)
    assert not any(label.startswith("data_service") for label in plain.recipes)
    assert plain.not_tried["data_service"] == "the input pipeline was not read stage by stage (no profile)"
    sequential = dataclasses.replace(
        offload,
        hotspots=Hotspots(
            stages=dataclasses.replace(host_limited, host_limited=False, recipe="data_pipeline"), layers=None
        ),
    )
    assert (
        "not yet parallel"
        in choose_candidates(two_cores, input_efficiency=0.5, diagnosis=sequential).not_tried["data_service"]
    )
