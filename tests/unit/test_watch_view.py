"""The watch view as data: column fit per width, fixed-width cells, sort and selection, the
regression marker on a recorded drop, health fields from the NVML twin, the H100/H200 note."""

import subprocess
import sys

import pytest
from nvml_twin import Twin, TwinGpu

from kernelfleet.catalog import Catalog
from kernelfleet.catalog.notes import same_die_note
from kernelfleet.telemetry.nvml import NvmlSource
from kernelfleet.telemetry.nvml_api import Nvml
from kernelfleet.telemetry.replay import ReplaySource
from kernelfleet.watch.cells import bar, memory, pct, spark
from kernelfleet.watch.keys import parse
from kernelfleet.watch.rows import rows
from kernelfleet.watch.screen import COLUMNS, fit, frame, gpu_lines, pack
from kernelfleet.watch.state import ViewState

pytestmark = pytest.mark.unit
CATALOG = Catalog.load()
NOTE = ("OFU uses each SKU's reference clock: H100 SXM 1830 MHz (datasheet), H200 SXM 2027 MHz (measured); "
        "identical work reads ~11 % higher on an H100. The H100 figure is the datasheet's, not yet measured on an H100.")


def twin_rows(fake_time, gpus, windows=2):
    source = NvmlSource(nvml=Nvml(Twin(gpus, fake_time.now)), clock=fake_time.now, wall=fake_time.wall,
                        sleep=fake_time.sleep)
    with source:
        return rows(list(source.batches(count=windows))[-1], CATALOG)


def text_of(group) -> list[str]:
    return [line.plain for line in group.renderables]


def test_80_columns_hold_every_always_column_and_the_model():
    layout = fit(80)
    assert sum(w for _, w in layout) + len(layout) - 1 <= 80
    headers = [c.header for c, _ in layout]
    assert headers == ["", "GPU", "model", "OFU", "tensor", "DRAM bw", "memory", "temp", "power", "history"]


def test_200_columns_show_every_column_and_widen_bars_and_history():
    layout = {c.header: w for c, w in fit(200)}
    assert set(layout) == {c.header for c in COLUMNS}
    assert layout["OFU"] > {c.header: w for c, w in fit(80)}["OFU"] and layout["history"] > 7
    assert sum(layout.values()) + len(layout) - 1 <= 200


def test_cells_keep_their_width_and_never_cut_a_number():
    assert (pct(1.0), pct(0.5634), pct(None)) == ("100.0%", "56.3%", "—")
    assert memory(int(1.6 * 2**30), 141 * 2**30, 10) == "  1.6/141G"
    assert memory(int(123.4 * 2**30), 141 * 2**30, 10) == "123.4/141G"
    assert memory(int(1.6 * 2**30), None, 10) == "      1.6G"  # an older recording: no total
    assert memory(None, None, 10) == "         —"
    assert memory(int(999.6 * 2**30), 1000 * 2**30, 9) == "    1000G"  # too wide with decimals: coarser, same width
    assert bar(0.5, 8, "green").plain == "████····" and bar(None, 4, "green").plain == "    "
    assert spark([0.0, 0.5, 1.0, None], 6) == "  ▁▅█ "


def test_pack_keeps_numbers_whole_and_lines_within_the_width():
    lines = pack(["OFU 56.3%", "SM 1476 MHz", NOTE], 40)
    assert all(len(line) <= 40 for line in lines)
    assert lines[0] == "OFU 56.3% · SM 1476 MHz · OFU uses each"
    assert "2027 MHz" in " ".join(lines) and "~11 %" in " ".join(lines)


def test_health_fields_show_in_the_rows_and_the_detail(fake_time):
    gpu = TwinGpu(clock_event_reasons=0x4, ecc_errors=(3, 0), pending_xids=[79], processes=[(4242, 3 << 30)])
    view = twin_rows(fake_time, [gpu])
    state = ViewState()
    state.observe(view)
    lines = text_of(frame(view, state, "kernelfleet watch", 80, 30, lambda r: NOTE))
    assert all(len(line) <= 80 for line in lines) and len(lines) <= 30
    row = next(line for line in lines if line.startswith("  0 "))
    assert " 66.8%" in row  # 0.9363 x 1446 MHz / 2027 MHz
    assert "  1.0/141G" in row and " 52C" in row and " 691W" in row
    detail = " ".join(lines)
    for shown in ("throttle sw_power_cap", "Xid 1 (last 79)", "ECC 3 corrected, 0 uncorrected", "2027 MHz"):
        assert shown in detail, shown
    assert "4242" in detail and "3.0G" in detail


def test_sort_cycles_and_missing_values_go_last(fake_time):
    gpus = [TwinGpu(uuid=f"GPU-{i}", power_watts=p) for i, p in enumerate([300.0, 700.0, 500.0])]
    view = twin_rows(fake_time, gpus)
    view[2]["power_mean_watts"] = None
    state = ViewState()
    assert [r["gpu"] for r in state.ordered(view)] == [0, 1, 2]
    for _ in range(3):
        assert state.press("s", view)
    assert state.sort == "power" and [r["gpu"] for r in state.ordered(view)] == [1, 0, 2]
    assert state.press("s", view) and state.sort == "gpu"
    state.press("2", view)
    assert state.current(view)["gpu"] == 2
    state.press("up", view)
    assert state.current(view)["gpu"] == 1
    state.press("9", view)  # no GPU 9: the selection stays
    assert state.current(view)["gpu"] == 1
    assert not state.press("q", view)


def test_a_recorded_ofu_drop_marks_its_gpu_and_the_recovery_clears_it(request):
    trace = request.config.rootpath / "tests" / "data" / "h200-detector" / "h200-drop.jsonl.gz"
    state = ViewState()
    marked = []
    for batch in ReplaySource(trace).batches():
        view = rows(batch, CATALOG)
        state.observe(view)
        marked.append(gpu_lines(view, state, 80)[1].plain.startswith("▼"))
    first = marked.index(True)
    assert 40 < first < 80 and not any(marked[:first])


def test_keys_parse_arrows_and_letters():
    assert parse(b"\x1b[Aq2\x1bOBS") == ["up", "q", "2", "down", "s"]


def test_the_h100_h200_note_comes_from_the_catalog():
    assert same_die_note(CATALOG) == NOTE
    assert same_die_note(CATALOG, CATALOG.get("h100-sxm")) == NOTE
    assert same_die_note(CATALOG, CATALOG.get("a100-sxm-80gb")) is None


def test_catalog_command_says_the_reference_clock_difference():
    done = subprocess.run([sys.executable, "-m", "kernelfleet", "catalog", "h100-sxm"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "~11 % higher on an H100" in " ".join(done.stdout.split()) and "not yet measured" in done.stdout
