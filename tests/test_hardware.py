"""HardwareSpec: validation, presets, make_hardware and the TOML file format."""
import re
from dataclasses import replace

import pytest

from horizon_sim.errors import HorizonError
from horizon_sim.specs.hardware import DeviceSpec, HardwareSpec, HostSpec, LinkSpec
from horizon_sim.specs.hardware_io import hardware_to_toml, load_hardware, save_hardware
from horizon_sim.specs.hardware_presets import (
    DEVICES, HOSTS, LINK_PEAK_GBps, LINKS, device_preset, host_preset, link_preset, make_hardware)
from horizon_sim.units import GiB, TB

# Theoretical per-direction x16 rates after 128b/130b encoding, GB/s (PCI-SIG).
# PCI Express Base Specification (PCI-SIG), x16 per direction after 128b/130b encoding:
# gen3 8 GT/s, gen4 16 GT/s, gen5 32 GT/s.
PCIE_THEORETICAL_GBps = {"pcie-gen3": 15.75, "pcie-gen4": 31.5, "pcie-gen5": 63.0}


def _device(**kw):
    args = dict(name="d", hbm_GiB=80, bf16_TFLOPs=100, fp32_TFLOPs=10, hbm_GBps=1000,
                default_link="pcie-gen4")
    return DeviceSpec(**{**args, **kw})


def _link(**kw):
    args = dict(name="l", h2d_GBps=25, d2h_GBps=25, latency_us=10, pageable_GBps=10)
    return LinkSpec(**{**args, **kw})


def _host(**kw):
    args = dict(name="h", ram_GiB=512, dram_GBps=300, cores=64, adam_Gparams_per_s=4)
    return HostSpec(**{**args, **kw})


# ---- spec validation ------------------------------------------------------------------------
@pytest.mark.parametrize("make, kw, match", [
    (_device, {"hbm_GiB": -3}, "device hbm_GiB=-3 must be > 0"),
    (_device, {"bf16_TFLOPs": 0}, "device bf16_TFLOPs=0 must be > 0"),
    (_device, {"fp32_TFLOPs": float("nan")}, "device fp32_TFLOPs=nan must be a finite number"),
    (_device, {"hbm_GBps": "fast"}, "device hbm_GBps='fast' must be a finite number"),
    (_device, {"matmul_efficiency": 1.2}, "device matmul_efficiency=1.2 must be <= 1"),
    (_device, {"matmul_efficiency": 0}, "device matmul_efficiency=0 must be > 0"),
    (_device, {"reserved_GiB": -1}, "device reserved_GiB=-1 must be >= 0"),
    (_device, {"reserved_GiB": 80}, "device reserved_GiB=80 must be less than hbm_GiB=80"),
    (_device, {"launch_overhead_us": -2}, "device launch_overhead_us=-2 must be >= 0"),
    (_device, {"name": ""}, "device name='' must be a non-empty string"),
    (_device, {"default_link": None}, "device default_link name=None"),
    (_link, {"h2d_GBps": -25}, "link h2d_GBps=-25 must be > 0"),
    (_link, {"d2h_GBps": True}, "link d2h_GBps=True must be a finite number"),
    (_link, {"latency_us": -1}, "link latency_us=-1 must be >= 0"),
    (_link, {"pageable_GBps": 0}, "link pageable_GBps=0 must be > 0"),
    (_host, {"ram_GiB": -1}, "host ram_GiB=-1 must be > 0"),
    (_host, {"ram_GiB": 8}, "host ram_GiB=8 must be more than os_reserved_GiB=8"),
    (_host, {"cores": 2.5}, "host cores=2.5 must be a positive integer"),
    (_host, {"cores": 0}, "host cores=0 must be a positive integer"),
    (_host, {"adam_Gparams_per_s": 0}, "host adam_Gparams_per_s=0 must be > 0"),
    (_host, {"dram_GBps": float("inf")}, "host dram_GBps=inf must be a finite number"),
    (_host, {"dram_channels": -1}, "host dram_channels=-1 must be a whole number >= 0 (0: not known)"),
    (_host, {"dram_channels": 16}, "host dram_channels=16 and dram_MTps=0 go together"),
    (_host, {"dram_MTps": 3200}, "host dram_channels=0 and dram_MTps=3200 go together"),
    (_host, {"dram_channels": 8, "dram_MTps": 3200},
     "host dram_GBps=300 is above the 204.8 GB/s that dram_channels=8 x dram_MTps=3200 x 8 bytes can carry"),
])
def test_bad_field_values_raise_with_the_value(make, kw, match):
    with pytest.raises(HorizonError, match=re.escape(match)):
        make(**kw)


def test_hardware_spec_checks_its_parts_and_usable_bytes():
    with pytest.raises(HorizonError, match="hardware device='h200' must be a DeviceSpec"):
        HardwareSpec(device="h200", link=_link(), host=_host())
    hw = HardwareSpec(device=_device(reserved_GiB=1.5), link=_link(), host=_host(os_reserved_GiB=8))
    assert hw.device_bytes_usable == int(78.5 * GiB)
    assert hw.host_bytes_usable == 504 * GiB
    assert isinstance(hw.device_bytes_usable, int) and isinstance(hw.host_bytes_usable, int)


def test_numbers_are_stored_as_floats():
    d = _device(hbm_GiB=80)
    assert type(d.hbm_GiB) is float and d == _device(hbm_GiB=80.0)
    assert type(_host().cores) is int


def test_link_owns_its_delay():
    link = _link(h2d_GBps=25, d2h_GBps=20, latency_us=10, pageable_GBps=10)
    assert link.h2d_seconds(25e9) == pytest.approx(1 + 10e-6)
    assert link.d2h_seconds(20e9) == pytest.approx(1 + 10e-6)
    assert link.h2d_seconds(10e9, pinned=False) == pytest.approx(1 + 10e-6)


# ---- presets --------------------------------------------------------------------------------
def test_preset_tables_cover_the_required_names():
    assert set(DEVICES) >= {"a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200", "gh200",
                            "l40s", "rtx-4090", "rtx-3090"}
    assert set(LINKS) >= {"pcie-gen3", "pcie-gen4", "pcie-gen5", "nvlink-c2c"}
    assert "default" in HOSTS
    for table in (DEVICES, LINKS, HOSTS):
        assert all(key == spec.name for key, spec in table.items())


@pytest.mark.parametrize("name", sorted(HOSTS))
def test_each_host_preset_records_its_memory_channels_and_achieves_a_stream_like_share(name):
    """The channels bound the achieved bus rate: dram_GBps is what STREAM-like copies reach,
    60-80% of channels x MT/s x 8 bytes; a calibrated host (channels not known) records none."""
    h = HOSTS[name]
    assert h.dram_channels > 0 and h.dram_MTps > 0
    assert 0.6 * h.dram_peak_GBps <= h.dram_GBps <= 0.8 * h.dram_peak_GBps
    assert _host().dram_peak_GBps == 0 and _host(dram_channels=16, dram_MTps=3200).dram_peak_GBps == pytest.approx(409.6)


def test_every_device_default_link_is_a_link_preset():
    for dev in DEVICES.values():
        assert dev.default_link in LINKS, dev.name


@pytest.mark.parametrize("name", sorted(LINKS))
def test_achieved_link_bandwidth_is_below_the_theoretical_rate(name):
    link = LINKS[name]
    peak = PCIE_THEORETICAL_GBps.get(name, LINK_PEAK_GBps[name])
    assert LINK_PEAK_GBps[name] == peak
    for bw in (link.h2d_GBps, link.d2h_GBps, link.pageable_GBps):
        assert 0 < bw < peak
    assert link.pageable_GBps < min(link.h2d_GBps, link.d2h_GBps)  # pinned is what pays
    assert link.h2d_GBps > 0.6 * peak  # achieved, not a pessimistic placeholder


def test_pcie_generations_double():
    g3, g4, g5 = (LINKS[f"pcie-gen{i}"].h2d_GBps for i in (3, 4, 5))
    assert g3 < g4 < g5
    assert 1.6 < g4 / g3 < 2.4 and 1.6 < g5 / g4 < 2.4


def test_device_presets_match_datasheets():
    # Sources: NVIDIA H200 Tensor Core GPU datasheet (141 GB HBM3e, 4.8 TB/s, 989 TFLOPS dense
    # bf16 for SXM); NVIDIA H100 Tensor Core GPU datasheet (SXM: 80 GB HBM3, 3.35 TB/s, 989
    # dense bf16; PCIe: 756); NVIDIA A100 datasheet (312 dense bf16; 40 GB and 80 GB); NVIDIA
    # GH200 Grace Hopper Superchip datasheet (NVLink-C2C host link).
    h200, h100 = DEVICES["h200"], DEVICES["h100-sxm"]
    # H200: "141 GB" HBM3e; the driver reports 143771 MiB = 140.4 GiB (not 141e9 B = 131 GiB).
    assert h200.hbm_GiB == pytest.approx(140.4, abs=0.1)
    assert h200.hbm_GBps == 4800 and h200.bf16_TFLOPs == 989
    # H100 SXM: 989 TFLOPs dense bf16 (1979 is the 2:4-sparsity figure).
    assert h100.bf16_TFLOPs == pytest.approx(989, abs=1)
    assert h100.hbm_GiB == pytest.approx(79.6, abs=0.1) and h100.hbm_GBps == 3350
    assert DEVICES["a100-80gb"].bf16_TFLOPs == 312 and DEVICES["a100-80gb"].hbm_GiB == 80
    assert DEVICES["a100-40gb"].hbm_GiB == 40
    assert DEVICES["h100-pcie"].bf16_TFLOPs == 756
    assert DEVICES["gh200"].default_link == "nvlink-c2c"
    for dev in DEVICES.values():
        # a dense bf16 tensor-core peak is always above plain fp32; sizes are plausible
        assert dev.bf16_TFLOPs > dev.fp32_TFLOPs, dev.name
        assert 16 < dev.hbm_GiB < 200 and 0 < dev.matmul_efficiency <= 1
        assert dev.reserved_GiB < dev.hbm_GiB


def test_preset_lookup_is_case_insensitive_and_says_did_you_mean():
    assert device_preset("H200") is DEVICES["h200"]
    assert link_preset(" PCIe-Gen5 ") is LINKS["pcie-gen5"]
    assert host_preset("default") is HOSTS["default"]
    with pytest.raises(HorizonError, match=r"unknown gpu 'h100-sxn' \(did you mean 'h100-sxm'\?\); presets: a100-40gb"):
        device_preset("h100-sxn")
    with pytest.raises(HorizonError, match=r"unknown link 'pcie-gen6'.*presets: pcie-gen3"):
        link_preset("pcie-gen6")
    with pytest.raises(HorizonError, match=r"unknown host 'defualt' \(did you mean 'default'\?\)"):
        host_preset("defualt")
    with pytest.raises(HorizonError, match="gpu name None must be a string"):
        device_preset(None)


# ---- make_hardware --------------------------------------------------------------------------
def test_make_hardware_uses_the_device_default_link():
    hw = make_hardware("h200")
    assert hw.device is DEVICES["h200"] and hw.link is LINKS["pcie-gen5"]
    assert hw.host == HOSTS["default"]
    assert make_hardware("gh200").link is LINKS["nvlink-c2c"]
    assert make_hardware("a100-80gb").link is LINKS["pcie-gen4"]
    assert make_hardware("h200", link="pcie-gen4").link is LINKS["pcie-gen4"]
    assert make_hardware("gh200", host="grace").host is HOSTS["grace"]
    assert "h200" in hw.name


def test_a_gh200_comes_with_its_grace_host():
    """A GH200 is a GPU and a Grace CPU on one module: planned with the x86 default host, it
    got an x86 server's cores, bus and AdamW rate."""
    gh = make_hardware("gh200", "480GB")
    assert gh.host.name == "grace" and gh.host.cores == HOSTS["grace"].cores
    assert gh.host.ram_GiB == pytest.approx(480e9 / GiB)  # --ram still sets its size
    assert make_hardware("gh200", host="default").host.name == "default"  # and a host can be named
    assert make_hardware("h200").host.name == "default"


def test_each_device_comes_with_the_host_it_is_sold_in():
    """Consumer cards sit in desktops (one socket, two DDR5 channels), a V100 of DeepSpeed's
    published runs in its DGX-2, the data-center cards in an x86 server."""
    expect = {"rtx-4090": "desktop", "rtx-3090": "desktop", "v100-32gb": "dgx-2", "gh200": "grace",
              "a100-80gb": "default", "h100-pcie": "default", "l40s": "default"}
    for gpu, host in expect.items():
        assert make_hardware(gpu, "128GiB").host.name == host, gpu


@pytest.mark.parametrize("ram, GiB_expected", [
    ("1.5TB", 1.5 * TB / GiB),
    ("1024GiB", 1024.0),
    ("512G", 512.0),
    (2 * 2**40, 2048.0),
])
def test_make_hardware_parses_ram(ram, GiB_expected):
    hw = make_hardware("h200", ram=ram)
    assert hw.host.ram_GiB == pytest.approx(GiB_expected)
    assert hw.host_bytes_usable == int((GiB_expected - hw.host.os_reserved_GiB) * GiB)
    # only the RAM changes
    assert replace(hw.host, ram_GiB=HOSTS["default"].ram_GiB) == HOSTS["default"]


def test_make_hardware_errors():
    with pytest.raises(HorizonError, match=r"unknown gpu 'h300'"):
        make_hardware("h300")
    with pytest.raises(HorizonError, match=r"unknown link 'nvlink'.*did you mean"):
        make_hardware("h200", link="nvlink")
    with pytest.raises(HorizonError, match=r"ram '12 potatoes' is not a size"):
        make_hardware("h200", ram="12 potatoes")
    with pytest.raises(HorizonError, match=r"host ram_GiB=4 must be more than os_reserved_GiB=8"):
        make_hardware("h200", ram="4G")


# ---- TOML round trip and file errors --------------------------------------------------------
@pytest.mark.parametrize("gpu", sorted(DEVICES))
def test_save_load_round_trip_every_device(gpu, tmp_path):
    hw = make_hardware(gpu, ram="1.5TB")
    path = tmp_path / f"{gpu}.toml"
    save_hardware(hw, path)
    assert load_hardware(path) == hw
    assert load_hardware(str(path)) == hw


def test_round_trip_awkward_strings_and_numbers(tmp_path):
    hw = HardwareSpec(device=_device(name='my "box"\\ é\t1', hbm_GiB=1e-3, reserved_GiB=0),
                      link=_link(latency_us=0), host=_host(ram_GiB=1e6 + 0.1), name="")
    path = tmp_path / "hw.toml"
    save_hardware(hw, path)
    assert load_hardware(path) == hw


def _write(tmp_path, text):
    path = tmp_path / "hw.toml"
    path.write_text(text, encoding="utf-8")
    return path


def _good_text():
    return hardware_to_toml(make_hardware("h200", ram="1TB"))


def _without_table(text, table):
    head, rest = text.split(f"\n[{table}]\n")
    return head + "\n" + ("\n[" + rest.split("\n[", 1)[1] if "\n[" in rest else "")


def test_file_not_found(tmp_path):
    with pytest.raises(HorizonError, match=r"hardware file '.*nope\.toml': not found"):
        load_hardware(tmp_path / "nope.toml")


def test_malformed_toml(tmp_path):
    path = _write(tmp_path, "[device\nname = 'h200'\n")
    with pytest.raises(HorizonError, match=r"hw\.toml': not valid TOML: .*line 1"):
        load_hardware(path)


def test_missing_table(tmp_path):
    text = _without_table(_good_text(), "host")
    with pytest.raises(HorizonError, match=r"hw\.toml': missing table \[host\]"):
        load_hardware(_write(tmp_path, text))


def test_table_that_is_not_a_table(tmp_path):
    text = "link = 3\n" + _without_table(_good_text(), "link")
    with pytest.raises(HorizonError, match=r"hw\.toml': link = 3 must be a table \[link\]"):
        load_hardware(_write(tmp_path, text))


def test_unknown_key_in_table_with_did_you_mean(tmp_path):
    text = _good_text().replace("hbm_GBps =", "hbm_GBs =")
    with pytest.raises(HorizonError,
                       match=r"hw\.toml': unknown key 'hbm_GBs' in \[device\] \(did you mean 'hbm_GBps'\?\)"):
        load_hardware(_write(tmp_path, text))


def test_unknown_top_level_key(tmp_path):
    text = "nmae = 'x'\n" + _good_text()
    with pytest.raises(HorizonError, match=r"unknown key 'nmae' \(did you mean 'name'\?\)"):
        load_hardware(_write(tmp_path, text))


def test_missing_required_key(tmp_path):
    text = "\n".join(line for line in _good_text().splitlines() if not line.startswith("cores ="))
    with pytest.raises(HorizonError, match=r"hw\.toml': \[host\] is missing key 'cores'"):
        load_hardware(_write(tmp_path, text))


def test_optional_keys_take_their_defaults(tmp_path):
    text = "\n".join(line for line in _good_text().splitlines()
                     if not line.startswith(("matmul_efficiency", "os_reserved_GiB", "name = \"h200 /")))
    hw = load_hardware(_write(tmp_path, text))
    assert hw.device.matmul_efficiency == 0.70 and hw.host.os_reserved_GiB == 8.0 and hw.name == ""


def test_wrong_type(tmp_path):
    text = _good_text().replace("cores = 64", 'cores = "64"')
    with pytest.raises(HorizonError, match=r"hw\.toml': host cores='64' must be a positive integer"):
        load_hardware(_write(tmp_path, text))
    text = _good_text().replace("hbm_GBps = 4800.0", "hbm_GBps = [4800]")
    with pytest.raises(HorizonError, match=r"hw\.toml': device hbm_GBps=\[4800\] must be a finite number"):
        load_hardware(_write(tmp_path, text))


def test_bad_value(tmp_path):
    text = _good_text().replace("hbm_GiB = ", "hbm_GiB = -3 #")
    with pytest.raises(HorizonError, match=r"hw\.toml': device hbm_GiB=-3 must be > 0"):
        load_hardware(_write(tmp_path, text))
    text = _good_text().replace("matmul_efficiency = 0.7", "matmul_efficiency = 1.5")
    with pytest.raises(HorizonError, match=r"matmul_efficiency=1.5 must be <= 1"):
        load_hardware(_write(tmp_path, text))


def test_integers_load_as_floats(tmp_path):
    text = _good_text().replace("hbm_GBps = 4800.0", "hbm_GBps = 4800")
    assert load_hardware(_write(tmp_path, text)) == make_hardware("h200", ram="1TB")


def test_save_rejects_non_specs(tmp_path):
    with pytest.raises(HorizonError, match="needs a HardwareSpec"):
        save_hardware({"device": "h200"}, tmp_path / "x.toml")
