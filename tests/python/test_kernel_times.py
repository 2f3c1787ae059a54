"""benchmark/kernel_times.py, the per-kernel summary of ncu's durations that scripts/gpu_check.sh's
profile phase prints: its sums decide where the GPU work goes next, so they must be right."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "benchmark"))
import kernel_times  # noqa: E402

HEAD = '"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n'


def row(i, name, value, unit="nsecond", metric=kernel_times.METRIC):
    return '"%d","%s","%s","%s","%s"\n' % (i, name, metric, unit, value)


def test_sums_each_kernel_in_milliseconds_and_skips_other_lines():
    lines = ["==PROF== Connected to process 1\n", "shape dtype fwd ms\n", HEAD,
             row(0, "gemm_dz_kernel<3>(args)", "1,500,000"),
             row(1, "nvjet_sm90_tss", "250", unit="usecond"),
             row(2, "gemm_dz_kernel<3>(args)", "0.5", unit="msecond"),
             row(3, "nvjet_sm90_tss", "99", metric="dram__bytes.sum"),
             "==PROF== Disconnected\n"]
    got = kernel_times.kernel_times(lines)
    assert list(got) == ["gemm_dz_kernel<3>(args)", "nvjet_sm90_tss"]
    assert got["gemm_dz_kernel<3>(args)"][0] == 2
    assert got["gemm_dz_kernel<3>(args)"][1] == pytest.approx(2.0)
    assert got["nvjet_sm90_tss"] == [1, pytest.approx(0.25)]


def test_unknown_unit_is_refused():
    with pytest.raises(ValueError, match="furlong"):
        kernel_times.kernel_times([HEAD, row(0, "k", "1", unit="furlong")])


def test_main_prints_per_run_totals_largest_first(tmp_path, capsys):
    f = tmp_path / "t.csv"
    f.write_text(HEAD + row(0, "small", "1000000") + row(1, "big", "6000000") +
                 row(2, "big", "2000000") + row(3, "small", "1000000"))
    assert kernel_times.main([str(f), "--runs", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split()[:4] == ["4.000", "1", "4.0000", "80.0%"] and out[1].endswith("big")
    assert out[2].split()[:4] == ["1.000", "1", "1.0000", "20.0%"] and out[2].endswith("small")
    assert out[3].split()[0] == "5.000"


def test_main_says_when_there_is_nothing(tmp_path, capsys):
    f = tmp_path / "empty.csv"
    f.write_text("no profile here\n")
    assert kernel_times.main([str(f)]) == 1
    assert "no gpu__time_duration.sum rows" in capsys.readouterr().err
