"""The result line names each number for what it is, and says why one is missing where the hardware is not why."""

from tfopt.profiling.metrics import CPU_NOTE, Metrics, compared

PROBLEM = "real steps ran 1.30x as fast as the compute-only ceiling, beyond twice the measured spread (2.0%)"


def test_a_gpu_line_leads_with_busy_and_mfu():
    before = Metrics("gpu", busy_percent=12.2, mfu_percent=3.14, input_wait_percent=70.0, input_efficiency_percent=31.0)
    after = Metrics("gpu", busy_percent=81.0, mfu_percent=25.0, input_wait_percent=0.4, input_efficiency_percent=99.0)
    assert compared(before, after) == (
        "accelerator busy 12% -> 81%, MFU 3.1% -> 25%, input wait 70% -> 0.4%, input efficiency 31% -> 99%"
    )


def test_a_gpu_line_without_a_capture_says_what_would_measure_busy_and_input_wait():
    before, after = Metrics("gpu", mfu_percent=3.0, input_efficiency_percent=50.0), Metrics("gpu", mfu_percent=9.0)
    assert compared(before, after) == (
        "MFU 3.0% -> 9.0%, input efficiency 50% -> n/a (accelerator busy % and input "
        "wait need a profiler capture: profile=True)"
    )


def test_a_cpu_line_leaves_out_accelerator_metrics_and_points_at_a_measurement_problem():
    before = Metrics("cpu", input_wait_percent=30.0, input_efficiency_percent=60.0)
    after = Metrics("cpu", input_wait_percent=1.0, measurement_problem=PROBLEM)
    assert compared(before, after) == (
        f"input wait 30% -> 1.0%, input efficiency 60% -> n/a ({CPU_NOTE}; input "
        "efficiency not read where n/a: the diagnosis notes say why)"
    )
    assert before.headline() == f"input wait 30%, input efficiency 60% ({CPU_NOTE})"
