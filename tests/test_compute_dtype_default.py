"""`horizon train`'s default compute dtype: bf16 on a GPU and on CPUs with bf16 matrix
instructions, fp32 on other CPUs (bf16 GEMMs ran 57x slower than fp32 on an AVX2-only EPYC),
said in one line; an explicit --compute-dtype always wins."""
import pytest

from horizon_exec.device import compute_dtype
from horizon_sim.cli.main import main

AVX2 = "flags\t\t: fpu sse2 avx avx2 fma"
ZEN4 = "flags\t\t: fpu avx2 avx512f avx512_bf16"
SPR = "flags\t\t: fpu avx512f amx_bf16 amx_tile"
NEOVERSE_V2 = "Features\t: fp asimd sve2 bf16 i8mm"


@pytest.mark.parametrize("line, want", [(AVX2, "fp32"), (ZEN4, "bf16"), (SPR, "bf16"), (NEOVERSE_V2, "bf16"),
                                        ("flags : avx512f avx512bw", "fp32")])
def test_cpu_default_follows_the_bf16_matrix_flags(line, want):
    dtype, why = compute_dtype.default_compute_dtype("cpu", line)
    assert dtype == want
    assert ("--compute-dtype bf16" in why) == (want == "fp32")


def test_a_gpu_computes_in_bf16_whatever_the_host():
    assert compute_dtype.default_compute_dtype("cuda", AVX2) == ("bf16", "")
    assert compute_dtype.default_compute_dtype("cuda:1", AVX2) == ("bf16", "")


TRAIN = ["train", "--model", "tiny", "--steps", "1", "--batch", "1", "--seq", "16", "--no-progress",
         "--eval-batches", "0"]


@pytest.mark.parametrize("line, extra, says", [
    (AVX2, [], "compute: fp32 by default: this CPU has no bf16 matrix instructions"),
    (ZEN4, [], "compute: bf16\n"),
    (AVX2, ["--compute-dtype", "bf16"], "compute: bf16\n"),
])
def test_train_says_what_it_computes_in(monkeypatch, capsys, line, extra, says):
    monkeypatch.setattr(compute_dtype, "cpu_flags", lambda: line)
    assert main(TRAIN + extra) == 0
    out = capsys.readouterr().out
    assert says in out, out
    assert out.count("compute: ") == 1
