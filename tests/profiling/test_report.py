"""report: every format shows the JSON's numbers, the figures hold the right series, the HTML renders in
a headless browser, and saving never leaves a half-written report."""

from __future__ import annotations

import base64
import dataclasses
import html.parser
import json
import math
import shutil
import subprocess
import types

import pytest

from tfopt.plan import Step
from tfopt.profiling.breakdown import CATEGORY_LABELS
from tfopt.profiling.report import (
    SHOWN_WHEN_MEASURED,
    SUMMARY_ROWS,
    ProfiledRun,
    Report,
    ReportedProfile,
    add_training,
    compare,
)
from tfopt.profiling.report_format import (
    Arrow,
    Bullets,
    Chart,
    Code,
    Emphasis,
    Footer,
    Heading,
    Paragraph,
    Strong,
    Table,
    to_html,
    to_markdown,
)


class _Tables(html.parser.HTMLParser):
    """Collects every <table id=...> as a list of rows of cell texts, and every <img> src."""

    def __init__(self):
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.images: list[str] = []
        self._table = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        if tag == "table":
            self._table = self.tables.setdefault(attributes.get("id", ""), [])
        elif tag == "tr" and self._table is not None:
            self._table.append([])
        elif tag in ("td", "th") and self._table is not None:
            self._cell = []
        elif tag == "img":
            self.images.append(attributes["src"])

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self._table[-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def _markdown_table(markdown: str, after_heading: str | None = None) -> list[list[str]]:
    lines = markdown.splitlines()
    start = lines.index(after_heading) if after_heading else 0
    rows, seen = [], False
    for line in lines[start:]:
        if line.startswith("|"):
            seen = True
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
        elif seen:
            break
    return [rows[0], *rows[2:]]  # without the |---| line


def _r(value: float) -> float:
    """The reports' rounding, written out independently: 4 significant digits, whole part kept."""
    return float(f"{value:.{max(4, len(str(int(abs(value)))))}g}")


def _value(cell: str):
    """A cell as the JSON has it: None, a number, or a word (the precision on an accelerator: "tf32")."""
    if cell == "n/a":
        return None
    try:
        return float(cell)
    except ValueError:
        return cell


def _assert_table_matches(rows, data, keys):
    header, body = rows[0], rows[1:]
    assert header[1:] == list(data["runs"])
    assert len(body) == len(keys)
    for row, key in zip(body, keys):
        for cell, run in zip(row[1:], data["runs"].values()):
            expected = key(run)
            assert _value(cell) == expected, (row[0], cell, expected)


@pytest.fixture
def fake_report(make_fake_profile):
    before = make_fake_profile(step_ms=40.0, input_ms=20.0, gpus=1)
    after = make_fake_profile(step_ms=21.0, input_ms=0.5, gpus=1)
    return compare(
        before,
        after,
        applied=[Step("data_pipeline", "parallel map, prefetch 4"), Step("xla", "no GPU supports it", skipped=True)],
        price_per_hour=2.5,
    )


@pytest.fixture(scope="module")
def real_report(starved_profile, tuned_profile):
    return compare(
        starved_profile,
        tuned_profile,
        applied=[Step("data_pipeline", "map(num_parallel_calls=32), prefetch(4)")],
        price_per_hour=0.4,
    )


# Rows of a report whose pipelines ran in the training process (none read from tf.data service workers).
SUMMARY_KEYS = [lambda run, key=key: run[key] for _, key in SUMMARY_ROWS if key not in SHOWN_WHEN_MEASURED]
BREAKDOWN_KEYS = [lambda run, category=category: run["breakdown_ms"][category] for category in CATEGORY_LABELS]


@pytest.mark.parametrize("which", ["fake_report", "real_report"])
def test_markdown_and_html_show_the_json_numbers(which, request):
    report = request.getfixturevalue(which)
    data = json.loads(report.to_json())
    markdown = report.to_markdown()
    _assert_table_matches(_markdown_table(markdown), data, SUMMARY_KEYS)
    _assert_table_matches(_markdown_table(markdown, "## Step-time breakdown (ms per step)"), data, BREAKDOWN_KEYS)
    tables = _Tables()
    tables.feed(report.to_html())
    _assert_table_matches(tables.tables["summary"], data, SUMMARY_KEYS)
    _assert_table_matches(tables.tables["breakdown"], data, BREAKDOWN_KEYS)
    assert f"**Speedup: {data['speedup']:g}x**" in markdown


def test_a_pipeline_read_from_the_service_shows_what_crossed_the_network(fake_report):
    """An offloaded "after" (data_service) adds the MiB/s row: bytes per batch x steps/s; "before" says n/a."""
    after = dataclasses.replace(fake_report.profiles["after"], served_bytes_per_batch=3 * 2**20)
    report = dataclasses.replace(fake_report, profiles={**fake_report.profiles, "after": after})
    data = report.to_dict()
    expected = _r(3 * after.measurement.real.steps_per_second)
    assert data["runs"]["after"]["service_mib_per_second"] == expected
    assert data["runs"]["before"]["service_mib_per_second"] is None
    assert f"| from tf.data service workers (MiB/s) | n/a | {expected:g} |" in report.to_markdown()
    assert "from tf.data service workers" not in fake_report.to_markdown()


def test_json_numbers_are_the_measurements(fake_report):
    data = fake_report.to_dict()
    before, after = fake_report.profiles["before"], fake_report.profiles["after"]
    run = data["runs"]["before"]
    real = before.measurement.real
    assert run["steps_per_second"] == _r(real.steps_per_second)
    assert run["examples_per_second"] == _r(real.examples_per_second)
    assert run["input_wait_percent"] == _r(before.breakdown.input_percent)
    assert run["busy_percent"] == _r(before.breakdown.busy_percent)
    assert run["input_efficiency_percent"] == _r(100 * before.measurement.input_efficiency)
    assert run["mfu_percent"] is None  # the fake measurement counted no FLOPs
    assert run["peak_memory_mib"] == 12 * 1024  # the allocator's peak, not NVML's reservation (16 GiB)
    assert run["profiling_overhead_percent"] == _r(100 * before.profiling_overhead)
    # Cost: 100 steps per epoch on one GPU at 2.5 per GPU-hour.
    hours = 100 / real.steps_per_second / 3600
    assert run["accelerator_hours_per_epoch"] == _r(hours)
    assert run["cost_per_epoch"] == _r(hours * 2.5)
    expected_speedup = data["runs"]["after"]["examples_per_second"] / run["examples_per_second"]
    assert data["speedup"] == _r(expected_speedup) and data["speedup"] > 1.8
    assert [step["recipe"] for step in data["applied"]] == ["data_pipeline", "xla"]
    assert data["runs"]["before"]["diagnosis"]["findings"][0]["recipe"] == "data_pipeline"
    assert data["runs"]["after"]["diagnosis"]["findings"] == [] and not after.diagnosis.input_bound


def test_a_larger_batch_is_compared_by_examples_and_its_epoch_by_the_same_examples(make_fake_profile):
    """batch_size 32 -> 256: each step takes 4x as long and holds 8x the examples. The speedup and the epoch's
    cost are of the examples (2x faster, half the cost), as the side-by-side rounds are; steps/s would say 0.25x."""
    before = make_fake_profile(step_ms=40.0, batch_size=32, steps_per_epoch=100)
    after = make_fake_profile(step_ms=160.0, batch_size=256, steps_per_epoch=13)
    data = compare(before, after, speedup_rounds=[1.9, 2.0, 2.1]).to_dict()
    runs = data["runs"]
    assert data["speedup"] == _r(runs["after"]["examples_per_second"] / runs["before"]["examples_per_second"])
    assert 1.9 < data["speedup"] < 2.1 and runs["after"]["steps_per_second"] < runs["before"]["steps_per_second"]
    hours = [runs[name]["accelerator_hours_per_epoch"] for name in ("before", "after")]
    assert hours[1] == pytest.approx(hours[0] / data["speedup"], rel=1e-3)
    markdown = compare(before, after).to_markdown()
    assert f"**Speedup: {data['speedup']:g}x** examples/s" in markdown
    assert "Per epoch (100 steps of the before run's batch)" in markdown


def test_report_text_has_every_section(fake_report):
    markdown = fake_report.to_markdown()
    for text in (
        "## Recipes: applied and left out",
        "- data_pipeline: parallel map, prefetch 4",
        "- xla: skipped: no GPU supports it",
        "## Diagnosis: before",
        "**cpu_preprocessing** (high",
        "## Diagnosis: after",
        "## Cost",
        "at 2.5 USD per hour",
        "## Profiling overhead",
        "steps/s with the profiler vs",
        "tensorboard --logdir /tmp/fake-logdir",
        "GPU allocator peak (TensorFlow)",
        "NVML utilization (%): the driver's coarse",
        "accelerator busy (% of wall step)",
        "input efficiency (% of on-device ceiling)",
        "accelerator-hours per epoch",
    ):
        assert text in markdown, text


def test_cost_without_a_known_epoch_or_price(make_fake_profile):
    report = compare(make_fake_profile(steps_per_epoch=None), make_fake_profile(steps_per_epoch=None))
    data = report.to_dict()
    assert data["runs"]["before"]["accelerator_hours_per_epoch"] is None
    assert "pass steps_per_epoch= to compare()" in report.to_markdown()
    priced = compare(make_fake_profile(), make_fake_profile(), steps_per_epoch=1000).to_dict()
    assert priced["steps_per_epoch"] == 1000 and priced["runs"]["before"]["cost_per_epoch"] is None
    assert priced["hours_unit"] == "machine-hours"  # no GPU in the fake: the machine is what is paid for


def test_breakdown_figure_has_a_bar_per_run_for_each_category(real_report):
    figure = real_report.figures()["breakdown"]
    (axes,) = figure.axes
    before, after = real_report.profiles["before"], real_report.profiles["after"]
    labels = [container.get_label() for container in axes.containers]
    assert labels == [
        CATEGORY_LABELS[c]
        for c in CATEGORY_LABELS
        if before.breakdown.categories[c] > 0 or after.breakdown.categories[c] > 0
    ]
    assert "waiting for input" in labels and "host: compute, dispatch, Python" in labels
    input_bars = axes.containers[labels.index("waiting for input")]
    assert [bar.get_width() for bar in input_bars] == pytest.approx(
        [before.breakdown.input_seconds * 1000, after.breakdown.input_seconds * 1000]
    )
    assert [tick.get_text() for tick in axes.get_yticklabels()] == ["before", "after"]


def test_every_figure_names_the_hardware_it_was_measured_on(fake_report):
    """An exported picture says where its numbers come from, as the page does."""
    hardware = fake_report.profiles["before"].hardware.describe()
    for name in ("breakdown", "metrics"):
        assert [text.get_text() for text in fake_report.figures()[name].texts] == [hardware], name


def test_metrics_figure_shows_each_runs_measured_metrics_and_hardware_samples(real_report):
    """On the machine that runs it: a CPU-only run's bars leave out accelerator busy % and MFU and its lines are
    the host's CPU use; on a GPU the bars start with accelerator busy % and, where NVML sampled the GPUs, the
    lines are each GPU's NVML samples."""
    figure = real_report.figures()["metrics"]
    metric_axes, hardware_axes = figure.axes
    profiles = real_report.profiles
    accelerator = profiles["before"].hardware.accelerator
    shown = [
        metric
        for metric in ("busy_percent", "mfu_percent", "input_wait_percent", "input_efficiency_percent")
        if any(getattr(profile.metrics, metric) is not None for profile in profiles.values())
    ]
    labels = {
        "busy_percent": "accelerator busy",
        "mfu_percent": "MFU",
        "input_wait_percent": "input wait",
        "input_efficiency_percent": "input efficiency",
    }
    assert [tick.get_text() for tick in metric_axes.get_xticklabels()] == [labels[metric] for metric in shown]
    if accelerator == "cpu":
        assert shown == ["input_wait_percent", "input_efficiency_percent"]
    else:
        assert shown[0] == "busy_percent"  # measured from the trace's device activity on any accelerator
    assert [container.get_label() for container in metric_axes.containers] == ["before", "after"]
    for container, profile in zip(metric_axes.containers, profiles.values()):
        assert [bar.get_height() for bar in container] == pytest.approx(
            [getattr(profile.metrics, metric) or 0.0 for metric in shown]
        )
    lines = [line for line in hardware_axes.get_lines() if not line.get_label().startswith("_")]
    devices = {name: profile.samples.accelerator_devices for name, profile in profiles.items()}
    if accelerator == "cpu":
        assert not any(devices.values())
    if any(devices.values()):  # NVML sampled the GPUs
        assert [line.get_label() for line in lines] == [
            f"{name} {device}" for name in profiles for device in devices[name]
        ]
        readings = [profile.samples.of(device) for name, profile in profiles.items() for device in devices[name]]
        assert "NVML" in hardware_axes.get_ylabel()
    else:
        assert [line.get_label() for line in lines] == ["before", "after"]
        readings = [profile.samples.of("host") for profile in profiles.values()]
        assert "host CPU use" in hardware_axes.get_ylabel()
    for line, samples in zip(lines, readings, strict=True):
        assert list(line.get_ydata()) == [s.utilization_percent for s in samples]


def test_metrics_figure_on_gpus_shows_busy_and_every_gpus_nvml_samples(make_fake_profile):
    report = compare(make_fake_profile(gpus=2), make_fake_profile(gpus=2, input_ms=1.0))
    metric_axes, hardware_axes = report.figures()["metrics"].axes
    assert [tick.get_text() for tick in metric_axes.get_xticklabels()] == [
        "accelerator busy",
        "input wait",
        "input efficiency",
    ]
    assert [line.get_label() for line in hardware_axes.get_lines()] == [
        "before gpu:0",
        "before gpu:1",
        "after gpu:0",
        "after gpu:1",
    ]
    assert "NVML" in hardware_axes.get_ylabel()


def test_cpu_reports_say_the_accelerator_metrics_do_not_apply(make_fake_profile, fake_report):
    """Hand-built CPU-only profiles, so that it says the same on any machine (the real report's note is the
    next test's)."""
    cpu_report = compare(make_fake_profile(), make_fake_profile(input_ms=1.0))
    assert "_CPU only: accelerator busy % and MFU do not apply._" in cpu_report.to_markdown()
    assert "<i>CPU only: accelerator busy % and MFU do not apply.</i>" in cpu_report.to_html()
    assert cpu_report.to_dict()["runs"]["before"]["busy_percent"] is None
    assert fake_report.to_dict()["note"] is None  # a GPU run has them
    assert "CPU only" not in fake_report.to_markdown() and fake_report.to_dict()["runs"]["before"]["busy_percent"]


def test_the_real_reports_note_and_busy_follow_the_machine(real_report):
    data = real_report.to_dict()
    hardware = real_report.profiles["before"].hardware
    assert data["hardware"] == hardware.describe()
    if hardware.accelerator == "cpu":
        assert "_CPU only: accelerator busy % and MFU do not apply._" in real_report.to_markdown()
        assert data["runs"]["before"]["busy_percent"] is None
    else:
        assert data["note"] is None and "CPU only" not in real_report.to_markdown()
        assert data["runs"]["before"]["busy_percent"] is not None


def test_the_report_says_a_float32_baseline_runs_tf32_on_an_ampere_or_newer_gpu(
    make_fake_profile, tf32_as_tensorflow_starts
):
    """The plan's steps reach the report, the baseline's TF32 note first, via tfopt.apply's result too."""
    from tests.conftest import FAKE_HARDWARE, make_cnn, make_images
    from tfopt.optimize import ApplyResult
    from tfopt.plan import make_plan
    from tfopt.recipes import MixedPrecision

    baseline = make_plan(make_cnn(), make_images(), hardware=FAKE_HARDWARE["h100"])
    plan = MixedPrecision(policy="float32")(baseline)
    before, after = make_fake_profile(gpus=1), make_fake_profile(gpus=1, input_ms=1.0)
    result = ApplyResult(
        model=None,
        dataset=None,
        strategy=None,
        plan=plan,
        baseline_plan=baseline,
        before=before.measurement,
        after=after.measurement,
        before_profile=before,
        after_profile=after,
    )
    note = (
        "baseline: float32 baseline: TF32 on this GPU (compute capability 9.0 >= 8.0: TensorFlow runs float32 "
        "matmuls and convolutions with a 10-bit mantissa); mixed_precision tf32: false gives IEEE float32"
    )
    for report in (compare(before, after, applied=plan.applied), result.report()):
        assert report.to_dict()["applied"][0] == {
            "recipe": "baseline",
            "detail": note[len("baseline: ") :],
            "skipped": False,
        }
        markdown = report.to_markdown()
        recipes = markdown[markdown.index("## Recipes: applied and left out") :].splitlines()
        assert recipes[2] == f"- {note}"
        assert (
            recipes[3].startswith("- mixed_precision: skipped: kept float32: requested")
            and "float32 math runs in TF32 on this GPU" in recipes[3]
        )
        assert f"<li>{html.escape(note)}</li>" in report.to_html()


def test_where_the_time_goes_tables_name_the_slow_map_before_and_after(real_report, session_model):
    data = real_report.to_dict()
    before, after = (data["runs"][name]["diagnosis"]["hotspots"] for name in ("before", "after"))
    # the sleeping map (fused by tf.data with its batch), named by its function: sequential, then parallel
    assert before["stages"]["bottleneck"] == after["stages"]["bottleneck"] == "map+batch load"
    slow_before, slow_after = (
        next(stage for stage in run["stages"]["stages"] if stage["label"] == "map+batch load")
        for run in (before, after)
    )
    assert slow_before["parallelism"] == 1 and slow_after["parallelism"] > 1
    assert slow_after["bound_seconds_per_batch"] < slow_before["bound_seconds_per_batch"] / 1.5
    assert before["stages"]["recipe"] == "data_pipeline"
    # the 2048x2048 Dense between the 64x2048 one and the output
    assert before["layers"]["top"] == after["layers"]["top"] == session_model.layers[1].name
    assert before["layers"]["device"] == ("GPU" if real_report.profiles["before"].hardware.gpus else "CPU")
    markdown = real_report.to_markdown()
    for title in ("## Input pipeline, stage by stage: before", "## Model, layer by layer: after"):
        assert title in markdown
    assert "| map+batch load | " in markdown and "Bottleneck: map+batch load." in markdown
    assert "hotspots" in real_report.figures()
    assert 'id="input-pipeline-before"' in real_report.to_html()


def test_html_is_self_contained_with_decodable_pngs(real_report):
    page = real_report.to_html()
    tables = _Tables()
    tables.feed(page)
    assert len(tables.images) == 3  # breakdown, metrics, hotspots
    for source in tables.images:
        assert source.startswith("data:image/png;base64,")
        assert base64.b64decode(source.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    assert "http://" not in page and "https://" not in page and "<script" not in page


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.skipif(_chromium() is None, reason="needs a headless browser: apt-get install chromium")
def test_html_opens_in_a_headless_browser(real_report, tmp_path):
    """Opens the report as a person would; a probe script added to a copy reports what the browser saw."""
    path = real_report.save(tmp_path / "report.html")
    probe = (
        "<script>window.addEventListener('load', () => { document.body.dataset.probe = JSON.stringify({"
        "images: [...document.images].map(i => [i.complete, i.naturalWidth, i.naturalHeight]),"
        "rows: document.querySelectorAll('#summary tbody tr').length, title: document.title}); });</script>"
    )
    probed = tmp_path / "probed.html"
    probed.write_text(path.read_text().replace("</body>", probe + "</body>"))
    result = subprocess.run(
        [
            _chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=3000",
            "--dump-dom",
            probed.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    dom = _Probe()
    dom.feed(result.stdout)
    seen = json.loads(dom.probe)
    assert seen["title"] == "tfopt report" and seen["rows"] == len(SUMMARY_KEYS)
    assert set(real_report.figures()) == {"breakdown", "metrics", "hotspots"}
    assert len(seen["images"]) == 3 and all(
        done and width > 300 and height > 100 for done, width, height in seen["images"]
    )
    console = [line for line in result.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert console == []


class _Probe(html.parser.HTMLParser):
    probe = "null"

    def handle_starttag(self, tag, attrs):
        if tag == "body":
            self.probe = dict(attrs).get("data-probe", "null")


def test_save_picks_the_format_by_suffix(fake_report, tmp_path):
    assert json.loads(fake_report.save(tmp_path / "r.json").read_text()) == fake_report.to_dict()
    assert fake_report.save(tmp_path / "r.md").read_text() == fake_report.to_markdown()
    assert fake_report.save(tmp_path / "sub" / "r.html").read_text().startswith("<!DOCTYPE html>")
    with pytest.raises(ValueError, match=r"cannot tell the format of 'r.pdf'.*\.html, \.htm, \.md"):
        fake_report.save(tmp_path / "r.pdf")


def test_failed_render_leaves_the_earlier_report(fake_report, tmp_path, monkeypatch):
    path = fake_report.save(tmp_path / "report.html")
    original = path.read_bytes()

    def broken(self):
        raise RuntimeError("matplotlib failed")

    monkeypatch.setattr(Report, "to_html", broken)
    with pytest.raises(RuntimeError, match="matplotlib failed"):
        fake_report.save(path)
    assert path.read_bytes() == original


def test_notebooks_display_reports_and_profiles(fake_report, make_fake_profile):
    fragment = fake_report._repr_html_()
    # A notebook embeds the fragment in its own page: no document, and no style outside the report.
    assert "<html" not in fragment and "<body" not in fragment
    assert fragment.split("</style>", 1)[1].strip() in fake_report.to_html()
    rules = [rule for rule in fragment.split("<style>", 1)[1].split("</style>", 1)[0].split("}") if rule.strip()]
    assert all(
        selector.strip().startswith(".tfopt-report") for rule in rules for selector in rule.split("{", 1)[0].split(",")
    )
    single = make_fake_profile()._repr_html_()
    tables = _Tables()
    tables.feed(single)
    assert tables.tables["summary"][0] == ["", "profile"] and "Speedup" not in single


def test_compare_accepts_plans_and_names_and_checks_numbers(make_fake_profile):
    before, after = make_fake_profile(), make_fake_profile()
    plan = types.SimpleNamespace(applied=(Step("xla", "jit_compile=True"),))
    assert compare(before, after, applied=plan).applied == (Step("xla", "jit_compile=True"),)
    assert compare(before, after, applied=["tfrecord"]).applied == (Step("tfrecord", ""),)
    with pytest.raises(ValueError, match="price_per_hour must be a finite number >= 0; received -1"):
        compare(before, after, price_per_hour=-1)
    with pytest.raises(ValueError, match=r"price_per_hour .* received nan"):
        compare(before, after, price_per_hour=math.nan)
    with pytest.raises(ValueError, match="steps_per_epoch must be >= 1; received 0"):
        compare(before, after, steps_per_epoch=0)


def test_the_speedup_says_its_range_over_side_by_side_rounds(make_fake_profile):
    report = compare(make_fake_profile(), make_fake_profile(input_ms=1.0), speedup_rounds=(1.2, 0.9, 1.1))
    data = report.to_dict()
    assert data["speedup_rounds"] == [1.2, 0.9, 1.1]
    assert data["speedup_noise"] == "[0.90-1.20], within noise: no measurable gain on this machine"
    expected = "3 rounds side by side: [0.90-1.20], within noise: no measurable gain on this machine)."
    assert expected in report.to_markdown() and expected in report.to_html()
    plain = compare(make_fake_profile(), make_fake_profile(input_ms=1.0)).to_dict()
    assert plain["speedup_rounds"] == [] and plain["speedup_noise"] is None
    two = compare(make_fake_profile(), make_fake_profile(input_ms=1.0), speedup_rounds=(1.2, 1.1)).to_markdown()
    assert "; 2 rounds side by side: too few for a spread)." in two and "side by side: 2 rounds" not in two


def test_a_training_section_added_to_saved_reports_equals_one_rendered_with_them(fake_report, tmp_path):
    """What a resumed run does: its measurements were saved by the attempt that was killed."""
    windows = [
        {
            "step": step,
            "steps": 10,
            "seconds": 1.0,
            "steps_per_second": 10.0 + step / 10,
            "examples_per_second": 320.0 + step,
            "input_wait_percent": 5.0,
        }
        for step in (10, 20, 30)
    ]
    trained = dataclasses.replace(fake_report, training=tuple(windows))
    saved = [fake_report.save(tmp_path / f"report{suffix}") for suffix in (".json", ".md", ".html")]
    data = add_training(saved, windows)
    assert data == json.loads(trained.to_json()) == json.loads(saved[0].read_text())
    assert saved[1].read_text() == trained.to_markdown()
    assert saved[2].read_text() == trained.to_html()
    assert add_training(saved, windows[:2])["training"]["windows"][-1]["step"] == 20  # a second resume replaces it
    assert saved[1].read_text().count("## Training (tfopt.Monitor)") == 1
    assert saved[2].read_text().count('alt="training chart"') == 1


# One of each block, with text that HTML must escape.
BLOCKS = [
    Heading("R&D report", level=1),
    Paragraph(("a ", Strong("b<c"), " ", Emphasis("d"), " ", Arrow(), " ", Code("x>y"))),
    Paragraph("headline", lead=True),
    Bullets(("one", ("two: ", Code("t 'q'")))),
    Table(("", "before"), (("row <1>", "2"), ("row 2", "n/a")), id="t&1"),
    Chart("speed"),
    Footer("v1, today"),
]


class _FakeFigure:
    def savefig(self, buffer, **options):
        buffer.write(b"png")


def test_the_markdown_formatter_writes_each_block_and_leaves_charts_out():
    assert to_markdown(BLOCKS) == (
        "# R&D report\n"
        "\n"
        "a **b<c** _d_ -> `x>y`\n"
        "\n"
        "headline\n"
        "\n"
        "- one\n"
        "- two: `t 'q'`\n"
        "\n"
        "|  | before |\n"
        "|---|---|\n"
        "| row <1> | 2 |\n"
        "| row 2 | n/a |\n"
        "\n"
        "_v1, today_\n"
    )


def test_the_html_formatter_escapes_every_string_and_embeds_charts():
    assert to_html(BLOCKS, {"speed": _FakeFigure()}) == (
        "<h1>R&amp;D report</h1>\n"
        "<p>a <b>b&lt;c</b> <i>d</i> &rarr; <code>x&gt;y</code></p>\n"
        '<p class="speedup">headline</p>\n'
        "<ul>\n<li>one</li>\n<li>two: <code>t &#x27;q&#x27;</code></li>\n</ul>\n"
        '<table id="t&amp;1"><thead><tr><th></th><th>before</th></tr></thead>'
        "<tbody><tr><th>row &lt;1&gt;</th><td>2</td></tr><tr><th>row 2</th><td>n/a</td></tr></tbody></table>\n"
        f'<figure><img alt="speed chart" src="data:image/png;base64,{base64.b64encode(b"png").decode()}"></figure>\n'
        "<footer>v1, today</footer>"
    )


def test_a_chart_without_its_figure_is_an_error():
    with pytest.raises(ValueError, match=r"the chart 'speed' has no figure; figures given: other"):
        to_html([Chart("speed")], {"other": _FakeFigure()})


def test_both_renderings_hold_the_same_text(fake_report):
    """Every heading of the Markdown is one of the HTML, and both end with the report's version and date."""
    markdown, page = fake_report.to_markdown(), html.unescape(fake_report.to_html())
    headings = [line.lstrip("# ") for line in markdown.splitlines() if line.startswith("#")]
    assert len(headings) == 8 and all(f">{heading}</h" in page for heading in headings)
    footer = f"tfopt report v1, {fake_report.created}"
    assert markdown.splitlines()[-1] == f"_{footer}_" and f"<footer>{footer}</footer>" in page


def test_a_profile_is_what_a_report_reads(make_fake_profile):
    profile = make_fake_profile()
    assert isinstance(profile, ReportedProfile) and isinstance(profile.capture, ProfiledRun)


def test_compare_refuses_what_is_not_a_profile(make_fake_profile):
    with pytest.raises(TypeError, match=r"compare: before is a NoneType, not a Profile: pass what tfopt.profile"):
        compare(None, None)
    with pytest.raises(TypeError, match="after is a int"):
        compare(make_fake_profile(), 2)
