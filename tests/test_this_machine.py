"""This machine's description (issue 39, item 4, the machine half): --hardware, else the
calibration `horizon calibrate` keeps in the per-user cache for this machine's key, else an
estimate (a quick measurement on the CPU backend, the GPU's preset on CUDA); the cache is
private; `--device` defaults to CUDA where torch sees a GPU (horizon_exec/measure/machine/,
horizon_exec/cli/default_device.py)."""
import os
import time
from dataclasses import replace
from types import SimpleNamespace

import pytest

from horizon_exec.measure import machine as M
from horizon_exec.measure.machine import cache, detect
from horizon_sim.cli.main import main
from horizon_sim.specs.cpu_ranks import is_cpu_backend
from horizon_sim.specs.hardware_io import hardware_to_toml, load_hardware, save_hardware
from tests.cpu_machine import CPU_HW
from tests.train_run import TINY

CACHED = replace(CPU_HW, name="the cached calibration")
MEASURED = replace(CPU_HW, name="a quick estimate")


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A per-user cache of this test's own (HORIZON_CACHE_DIR), and a quick estimate that returns
    MEASURED at once, counting its calls."""
    monkeypatch.setenv("HORIZON_CACHE_DIR", str(tmp_path / "cache"))
    calls = []

    def measure():
        calls.append(1)
        return hardware_to_toml(MEASURED), 0.5
    monkeypatch.setattr(M, "_measure_estimate", measure)
    return SimpleNamespace(calls=calls, key=detect.machine_key("cpu"), dir=tmp_path / "cache" / "machines")


def test_the_cache_folder_follows_the_xdg_rules(monkeypatch, tmp_path):
    monkeypatch.delenv("HORIZON_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == tmp_path / "xdg" / "horizon" / "machines"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # ignored, as the XDG spec says
    assert cache.cache_dir() == cache.Path.home() / ".cache" / "horizon" / "machines"
    monkeypatch.setenv("HORIZON_CACHE_DIR", str(tmp_path / "h"))
    assert cache.cache_dir() == tmp_path / "h" / "machines"


def test_order_hardware_file_then_cached_calibration_then_estimate(home, tmp_path):
    given = tmp_path / "given.toml"
    save_hardware(replace(CPU_HW, name="the given file"), given)
    m = M.this_machine("cpu")  # nothing cached: the estimate, measured and cached
    assert (m.kind, m.hardware.name, len(home.calls)) == (M.ESTIMATE, "a quick estimate", 1)
    assert m.source.startswith("estimate: measured here in 0.5 s (cached in ") and "for 24 h" in m.source
    assert len(M.lines(m)) == 2 and "`horizon calibrate` (about" in M.lines(m)[1]
    again = M.this_machine("cpu")  # the cached estimate: not measured again
    assert len(home.calls) == 1 and again.source.startswith("estimate: measured here on ")
    assert again.hardware.name == "a quick estimate"
    M.save_calibration(CACHED, "cpu")
    m = M.this_machine("cpu")
    assert (m.kind, m.hardware.name) == (M.CALIBRATED, "the cached calibration")
    assert m.source == (f"calibration cached in {cache.shown(cache.calibration_path(home.key))} on "
                        f"{time.strftime('%Y-%m-%d')}")
    assert M.lines(m) == [f"machine: {m.source}"]
    m = M.this_machine("cpu", str(given))
    assert (m.kind, m.hardware.name, m.source) == (M.FILE, "the given file", f"--hardware {given}")


def test_an_old_estimate_is_measured_again(home):
    M.this_machine("cpu")
    path = cache.estimate_path(home.key)
    old = time.time() - cache.ESTIMATE_LIFE_S - 60
    os.utime(path, (old, old))
    assert M.this_machine("cpu").source.startswith("estimate: measured here in ") and len(home.calls) == 2


def test_the_cache_is_private(home):
    where = M.save_calibration(CACHED, "cpu")
    path = cache.calibration_path(home.key)
    assert where == cache.shown(path) and path.parent == home.dir
    assert path.stat().st_mode & 0o777 == 0o600 and home.dir.stat().st_mode & 0o777 == 0o700
    assert path.read_text().startswith("# horizon machine key: ")
    assert load_hardware(path) == CACHED  # a hardware file `horizon plan --hardware` reads too


@pytest.mark.parametrize("what", ["file", "folder"])
def test_a_cache_others_can_write_is_not_trusted(home, what):
    M.save_calibration(CACHED, "cpu")
    path = cache.calibration_path(home.key)
    os.chmod(path if what == "file" else home.dir, 0o666 if what == "file" else 0o777)
    m = M.this_machine("cpu")
    assert m.kind == M.ESTIMATE and m.hardware.name == "a quick estimate"
    assert "(the cached calibration is not used: " in m.source and "writable by group and others" in m.source
    if what == "folder":  # nor is the estimate kept there
        assert "not cached: the cache folder" in m.source and not cache.estimate_path(home.key).exists()


def test_a_calibration_of_another_machine_is_not_used(home):
    for field, other in (("cores", home.key["cores"] + 1), ("cpu_flags", "0" * 12), ("torch", "0.1"),
                         ("device", "NVIDIA H200")):
        key = dict(home.key, **{field: other})
        cache.write(cache.calibration_path(key), hardware_to_toml(CACHED))
    assert len(list(home.dir.glob("*.toml"))) == 4
    m = M.this_machine("cpu")
    assert m.kind == M.ESTIMATE and m.hardware.name == "a quick estimate"


def test_a_damaged_cached_calibration_falls_back_to_the_estimate(home):
    cache.write(cache.calibration_path(home.key), "[device\n")
    m = M.this_machine("cpu")
    assert m.kind == M.ESTIMATE and "(the cached calibration is not used: unreadable)" in m.source


def test_a_failed_estimate_does_not_stop_the_run(home, monkeypatch):
    from horizon_sim.errors import HorizonError

    def fails():
        raise HorizonError("the quick estimate of this machine failed (exit 1): boom")
    monkeypatch.setattr(M, "_measure_estimate", fails)
    m = M.this_machine("cpu")
    assert m.kind == M.ESTIMATE and m.source.startswith("estimate: the quick measurement failed: ")
    assert is_cpu_backend(m.hardware) and m.hardware.host.cores == (os.cpu_count() or 1)


def test_the_quick_estimate_is_a_cpu_backend_file_of_this_machine(tmp_path):
    """The real measurement, in its child process (seconds): every figure the planner prices a
    CPU step with is there and sane; how close it comes to a calibration is measured, not
    asserted (docs/calibration.md)."""
    text, seconds = M._measure_estimate()
    path = tmp_path / "estimate.toml"
    path.write_text(text)
    hw = load_hardware(path)
    d, h = hw.device, hw.host
    assert is_cpu_backend(hw) and seconds > 0
    assert h.cores == (os.cpu_count() or 1) and abs(h.ram_GiB - detect.host_ram_GiB()) < 0.01
    assert d.hbm_GiB == h.ram_GiB and 0.1 < h.runtime_overhead_GiB < h.ram_GiB  # the child's RSS: torch and a trainer
    for dtype in ("bf16", "fp32"):
        rows = [r for r in d.gemm_TFLOPs if r[0] == dtype]
        assert {r[1] for r in rows} == {"nt", "nn", "tn"} and all(r[5] > 0 for r in rows)
        assert max(r[5] for r in rows) == (d.bf16_TFLOPs if dtype == "bf16" else d.fp32_TFLOPs)
    assert 0 < d.matmul_efficiency <= 1 and d.attention_TFLOPs and d.masked_attention_TFLOPs
    # attention in a default run's own dtype (fp32 without bf16 instructions), the one it is priced in
    from horizon_exec.device.compute_dtype import default_compute_dtype
    for table in (d.attention_TFLOPs, d.masked_attention_TFLOPs):
        assert {r[0] for r in table} == {default_compute_dtype("cpu")[0]}
    assert d.hbm_GBps > 0 and d.loss_ns_per_logit > 0 and h.adam_Gparams_per_s > 0 and h.dram_GBps > 0
    assert {"forward", "backward", "recompute", "head"} <= {k for k, _ in d.op_overhead_us}
    threads = [int(r[0]) for r in d.thread_speed]
    assert threads[0] == 1 and threads[-1] == h.cores and d.compute_threads == max(1, h.cores - 1)
    # each kernel kind's scaling at the same counts (timed in the compute lane's thread, the cores
    # read before: there the lane's own core would give only the 1-thread row, and a split priced
    # on the block alone put a 2-core run on one thread, 1.8x slower)
    assert [int(r[0]) for r in d.thread_kernel_speed] == threads
    assert dict((int(t), a) for t, a, _ in d.thread_speed)[d.compute_threads] == 1.0  # the base split's own row


def test_on_cuda_the_gpus_preset_with_its_memory(home, monkeypatch):
    monkeypatch.setattr(detect, "gpu", lambda device: ("NVIDIA H200", 139.8))
    m = M.this_machine("cuda")
    assert m.kind == M.ESTIMATE and m.source.startswith("estimate: the h200 preset with this GPU's 139.8 GiB")
    assert m.hardware.device.hbm_GiB == 139.8 and m.hardware.host.cores == (os.cpu_count() or 1)
    assert m.hardware.host.runtime_overhead_GiB == 0 and abs(m.hardware.host.ram_GiB - detect.host_ram_GiB()) < 0.01
    monkeypatch.setattr(detect, "gpu", lambda device: ("Tesla K80", 11.2))
    m = M.this_machine("cuda:1")
    assert "no preset names 'Tesla K80': the h100-pcie preset's speeds" in m.source
    assert m.hardware.device.hbm_GiB == 11.2 and not home.calls  # nothing measured on a GPU


def _cuda(monkeypatch, available: bool):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: SimpleNamespace(name="NVIDIA H200", total_memory=150 * 2**30))


def test_the_default_device_is_cuda_where_torch_sees_a_gpu(monkeypatch):
    from horizon_exec.cli.default_device import default_device, resolve_device
    _cuda(monkeypatch, True)
    dev, why = default_device()
    assert dev == "cuda" and why.startswith("device cuda: a GPU is available (NVIDIA H200")
    _cuda(monkeypatch, False)
    assert default_device() == ("cpu", "device cpu: no GPU (torch sees no CUDA device)")

    def asked():
        raise AssertionError("a --device given asks torch nothing")
    monkeypatch.setattr(detect, "cuda_here", asked)
    assert resolve_device("cpu") == ("cpu", "") and resolve_device("cuda:1") == ("cuda:1", "")


@pytest.mark.usefixtures("one_intraop_thread")
def test_train_says_its_device_and_machine_and_admits_on_it(home, monkeypatch, capsys):
    from horizon_exec.runtime import assemble
    _cuda(monkeypatch, False)
    seen = []
    admit = assemble.admit
    monkeypatch.setattr(assemble, "admit", lambda *a, **k: seen.append(k["hardware"]) or admit(*a, **k))
    assert main(["train", *TINY, "--steps", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "device cpu: no GPU (torch sees no CUDA device)"
    assert seen == [MEASURED] and len(home.calls) == 1
    said = [ln for ln in out if ln.startswith("machine: ")]
    assert said[0].startswith("machine: no calibration of this machine cached: measuring a quick estimate")
    assert said[1].startswith("machine: estimate: measured here in 0.5 s") and "`horizon calibrate`" in said[2]


def test_calibrate_keeps_a_full_calibration_in_the_cache(home, monkeypatch, capsys, tmp_path):
    import horizon_exec.measure.calibrate as C
    monkeypatch.setattr(C, "calibrate", lambda device, **k: CACHED)
    assert main(["calibrate", "--device", "cpu"]) == 0  # no -o: the cache only
    assert f"wrote {cache.shown(cache.calibration_path(home.key))}: the cached calibration" in capsys.readouterr().out
    assert M.this_machine("cpu").kind == M.CALIBRATED and not home.calls
    out = tmp_path / "m.toml"
    assert main(["calibrate", "--device", "cpu", "--quick", "-o", str(out), "--no-cache"]) == 0
    assert out.is_file() and len(list(home.dir.glob("*.toml"))) == 1
    assert main(["calibrate", "--quick"]) == 2
    err = capsys.readouterr().err.strip()
    assert "give -o FILE.toml: a --quick calibration is not kept in the per-user cache" in err and "\n" not in err


def test_calibrate_without_a_usable_cache_is_refused_before_measuring(home, monkeypatch, capsys, tmp_path):
    import horizon_exec.measure.calibrate as C
    calls = []
    monkeypatch.setattr(C, "calibrate", lambda device, **k: calls.append(device) or CACHED)
    _cuda(monkeypatch, False)
    home.dir.mkdir(parents=True)
    os.chmod(home.dir, 0o777)
    assert main(["calibrate"]) == 2 and not calls
    err = capsys.readouterr().err.strip()
    assert f"the per-user cache {home.dir} cannot be used (" in err and "give -o FILE.toml" in err
    out = tmp_path / "m.toml"  # with -o: measured (on the default device, said), written there, the cache said
    assert main(["calibrate", "-o", str(out)]) == 0 and calls == ["cpu"] and out.is_file()
    err = capsys.readouterr().err
    assert "device cpu: no GPU (torch sees no CUDA device)" in err and "not kept in the per-user cache" in err


def test_a_hardware_file_without_a_runtime_figure_leaves_the_admission_its_own(monkeypatch):
    """Runtime 0 in a hardware file (this machine's estimates) is 'not measured': the admission
    counts RSS + RUNTIME_GROWTH_BYTES as with no file, not the RSS alone."""
    from horizon_exec.runtime import admission
    from horizon_sim.schedule import build_schedule
    from horizon_sim.specs.model_presets import model_preset
    from horizon_sim.specs.policy import Policy
    monkeypatch.setattr(admission, "rss_bytes", lambda: 100 * 2**20)
    model, policy = model_preset("tiny"), Policy(batch=1, seq=64)
    sched = build_schedule(model, policy)
    none = admission.admit(model, policy, sched, hardware=None, advise=False)
    zero = admission.admit(model, policy, sched, hardware=replace(
        CPU_HW, host=replace(CPU_HW.host, runtime_overhead_GiB=0.0)), advise=False)
    assert zero.host_by_role["runtime"] == none.host_by_role["runtime"] == 100 * 2**20 + admission.RUNTIME_GROWTH_BYTES


def test_the_cpu_attention_tables_cover_the_tiny_presets_head_dim():
    """SDPA per FLOP is 1.1-1.4x slower at head_dim 32 than at 64 on the AMX VM and the tables do
    not extrapolate: calibrate's CPU grid and the quick estimate measure 32 (tiny: 256 / 8 heads),
    so `horizon train --model tiny` is not priced at 64's rate (its calibrated step went from
    -25% to +3% of the measured one)."""
    from horizon_exec.measure.calibrate.kernels import attention_grid
    from horizon_exec.measure.machine.estimate import ATTENTION_POINTS
    from horizon_sim.specs.model_presets import model_preset
    tiny = model_preset("tiny")
    hd = tiny.hidden // tiny.n_heads
    assert {d for _, d in attention_grid(False, "cpu")} >= {hd, 64, 128}
    assert (1024, hd) in ATTENTION_POINTS and max(s for s, _ in ATTENTION_POINTS) == 1024
    assert {d for _, d in attention_grid(False, "cuda")} == {64, 128}  # the GPU grid is unchanged
