"""The MXFP4 codec of gpt-oss checkpoints (horizon_exec/checkpoints/hf_mxfp4.py): bit for bit
transformers' dequantization, quantize() its inverse, and read()'s checks of a safetensors pair."""
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from horizon_exec.checkpoints import hf_mxfp4 as M
from horizon_sim.errors import HorizonError

_BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16}


def bits(t):
    """The tensor's bit patterns (so -0.0 != 0.0 and a NaN equals itself)."""
    return t.contiguous().view(_BITS[t.dtype])


def random_parts(E=3, out=8, G=4, lo=110, hi=141, seed=0):
    g = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (E, out, G, 16), dtype=torch.uint8, generator=g)
    scales = torch.randint(lo, hi, (E, out, G), dtype=torch.uint8, generator=g)
    return blocks, scales


def transformers_convert(blocks, scales, dtype):
    from transformers.integrations.mxfp4 import _convert_moe_packed_tensors
    return _convert_moe_packed_tensors(blocks.clone(), scales.clone(), dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dequantize_is_transformers_bit_for_bit(dtype):
    blocks, scales = random_parts()
    ref = transformers_convert(blocks, scales, dtype)  # (E, in, out): transposed
    ours = M.dequantize(blocks, scales, dtype)
    assert ours.dtype == dtype and ours.shape == (3, 8, 4 * 32)
    assert torch.equal(bits(ours), bits(ref.transpose(1, 2)))
    h = M.held(blocks, scales, dtype)
    assert h.shape == ref.shape == (3, 4 * 32, 8) and h.is_contiguous()
    assert torch.equal(bits(h), bits(ref))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dequantize_full_scale_range_and_chunks(dtype, monkeypatch):
    """Every scale byte, 255 (E8M0's NaN, which transformers decodes to inf/NaN) included, and chunks
    that split the rows unevenly: still transformers' bits."""
    monkeypatch.setattr(M, "_CHUNK_ROWS", 7)
    g = torch.Generator().manual_seed(1)
    blocks = torch.randint(0, 256, (2, 16, 8, 16), dtype=torch.uint8, generator=g)
    scales = torch.arange(256, dtype=torch.uint8).reshape(2, 16, 8)
    ref = transformers_convert(blocks, scales, dtype)
    assert torch.equal(bits(M.held(blocks, scales, dtype)), bits(ref))


def test_dequantize_known_values():
    # byte 0x71: low nibble 1 (+0.5) first, high nibble 7 (+6); 0xF8: -0.0 then -6; scale 128 = 2^1
    blocks = torch.zeros(1, 1, 16, dtype=torch.uint8)
    blocks[0, 0, 0], blocks[0, 0, 1] = 0x71, 0xF8
    w = M.dequantize(blocks, torch.tensor([[128]], dtype=torch.uint8))
    assert w.shape == (1, 32)
    assert w[0, :4].tolist() == [1.0, 12.0, -0.0, -12.0] and torch.signbit(w[0, 2])
    assert torch.equal(w[0, 4:], torch.zeros(28))


def test_dequantize_refuses_unpaired_shapes():
    blocks, scales = random_parts()
    with pytest.raises(HorizonError, match="do not pair"):
        M.dequantize(blocks, scales[:, :, :3])


def test_quantize_round_trip_exact_on_representable():
    """Any blocks and scales decode to representable values; quantizing those gives them back exactly
    (bits, signed zeros included), though not always the same codes (a block whose max is 1 re-encodes
    with a smaller scale). Scales up to 252: above, the larger codes overflow fp32 (6 * 2^126 > 2^128)."""
    blocks, scales = random_parts(E=2, out=16, G=6, lo=0, hi=253, seed=2)
    scales[0, 0, 0] = 0  # the smallest E8M0 exponent: subnormal fp32 values
    blocks[0, 0, 1] = 0x22  # a block whose max is 1.0
    blocks[0, 0, 2] = 0x80  # zeros only, one of them -0.0
    w = M.dequantize(blocks, scales)
    b2, s2 = M.quantize(w)
    assert b2.dtype == s2.dtype == torch.uint8 and b2.shape == blocks.shape and s2.shape == scales.shape
    assert torch.equal(bits(M.dequantize(b2, s2)), bits(w))


def _nearest(x, scale):
    """Brute force: the nearest of the 16 values times 2^(scale - 127) to each x, and its distance."""
    cand = torch.tensor(M.FP4_VALUES) * torch.pow(2.0, scale.float() - 127).unsqueeze(-1)
    return (x.unsqueeze(-1) - cand.unsqueeze(-2)).abs().amin(-1)


def test_quantize_error_on_random_normal_weights():
    g = torch.Generator().manual_seed(3)
    w = torch.randn(4, 24, 96, generator=g) * torch.logspace(-6, 2, 24).unsqueeze(-1)
    blocks, scales = M.quantize(w)
    back = M.dequantize(blocks, scales)
    err = (back - w).abs().view(4, 24, 3, 32)
    x = w.view(4, 24, 3, 32)
    amax = x.abs().amax(-1)
    # the spec's exponent: floor(log2(max)) - 2, so the block's max lands in [4, 8) * 2^e
    step = torch.pow(2.0, scales.float() - 127)
    assert torch.equal(step, torch.pow(2.0, torch.floor(torch.log2(amax)) - 2))
    # each element goes to the nearest value except the saturated ones, which go to 6 * 2^e
    sat = x.abs() > 6 * step.unsqueeze(-1)
    assert torch.equal(err[~sat], _nearest(x, scales)[~sat])
    assert sat.any() and torch.equal(back.view_as(x)[sat].abs(), (6 * step.unsqueeze(-1)).expand_as(x)[sat])
    # the bound: half the largest spacing (2) times 2^e where not saturated, under 2 * 2^e where it is
    assert (err[~sat] <= step.unsqueeze(-1).expand_as(x)[~sat]).all()
    assert (err < 2 * step.unsqueeze(-1)).all()
    assert torch.equal(torch.sign(back.view_as(x))[back.view_as(x) != 0], torch.sign(x)[back.view_as(x) != 0])


def test_quantize_hits_every_code_and_rounds_ties_to_even():
    # scale 2^0 (max 6 in [4, 8)): the 16 values exactly, then the 7 midpoints each way
    vals = list(M.FP4_VALUES)
    mids = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    want = [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]  # the even code's value at each tie
    row = vals + mids + [-m for m in mids] + [6.0, 0.0]
    w = torch.tensor(row).reshape(1, 32)
    blocks, scales = M.quantize(w)
    assert scales.tolist() == [[127]]
    codes = torch.stack([blocks & 0x0F, blocks >> 4], -1).reshape(-1)
    assert codes[:16].tolist() == list(range(16))
    back = M.dequantize(blocks, scales)[0].tolist()
    assert back[16:23] == want and back[23:30] == [-v for v in want]


def test_quantize_saturates_at_six():
    w = torch.zeros(1, 32)
    w[0, 0], w[0, 1], w[0, 2], w[0, 3] = 7.99, 4.0, -7.0, 5.01  # max in [4, 8): e = 0
    blocks, scales = M.quantize(w)
    assert scales.tolist() == [[127]]
    assert M.dequantize(blocks, scales)[0, :4].tolist() == [6.0, 4.0, -6.0, 6.0]


def test_quantize_all_zero_block_and_tiny_block():
    w = torch.zeros(2, 64)
    w[1, 32:48] = 2.0 ** -128  # max below 2^-125: e clamps to -127 (scale byte 0); 2^-128 is 0.5 * 2^-127
    w[1, 48:] = 2.0 ** -140  # under a quarter of 2^-127: rounds to 0
    w[0, 5] = -0.0
    blocks, scales = M.quantize(w)
    assert scales.tolist() == [[127, 127], [127, 0]]
    assert torch.equal(blocks[0], torch.zeros_like(blocks[0]).index_put_((torch.tensor([0]), torch.tensor([2])),
                                                                            torch.tensor([0x80], dtype=torch.uint8)))
    assert blocks[1, 1].tolist() == [0x11] * 8 + [0] * 8
    want = w.clone()
    want[1, 48:] = 0.0
    assert torch.equal(bits(M.dequantize(blocks, scales)), bits(want))


def test_quantize_refuses():
    with pytest.raises(HorizonError, match="multiple of 32"):
        M.quantize(torch.zeros(2, 48))
    with pytest.raises(HorizonError, match="multiple of 32"):
        M.quantize(torch.zeros(2, 32, dtype=torch.bfloat16))
    with pytest.raises(HorizonError, match="non-finite"):
        M.quantize(torch.full((1, 32), float("inf")))


def test_names():
    held = "model.layers.3.mlp.experts.gate_up_proj"
    assert M.stored_names(held) == (held + "_blocks", held + "_scales")
    for n in ("model.layers.0.mlp.experts.gate_up_proj_blocks", "model.layers.0.mlp.experts.gate_up_proj_scales",
              "model.layers.11.mlp.experts.down_proj_blocks", "model.layers.11.mlp.experts.down_proj_scales"):
        assert M.is_mxfp4_part(n)
    for n in ("model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.gate_up_proj_bias",
              "model.layers.0.mlp.experts.down_proj_bias", "model.layers.0.mlp.router.weight",
              "model.layers.0.mlp.experts.down_proj"):
        assert not M.is_mxfp4_part(n)


NAME = "model.layers.0.mlp.experts.down_proj"
E, OUT, IN = 2, 8, 64  # down_proj (E, H, I/32, 16) stored, held (E, I, H)


def _write(tmp_path, tensors):
    p = tmp_path / "model.safetensors"
    save_file(tensors, str(p))
    return p


def _read(p, shape=(E, IN, OUT)):
    with safe_open(str(p), framework="pt") as f:
        return M.read(f, NAME, "ckpt", shape)


def _parts():
    blocks, scales = random_parts(E=E, out=OUT, G=IN // 32, seed=4)
    return {NAME + "_blocks": blocks, NAME + "_scales": scales, "other.weight": torch.ones(3)}


def test_read_good_pair(tmp_path):
    parts = _parts()
    got = _read(_write(tmp_path, parts))
    assert got.dtype == torch.float32 and got.shape == (E, IN, OUT)
    assert torch.equal(bits(got), bits(M.held(parts[NAME + "_blocks"], parts[NAME + "_scales"])))


@pytest.mark.parametrize("missing", ["_blocks", "_scales"])
def test_read_refuses_a_missing_part(tmp_path, missing):
    parts = _parts()
    del parts[NAME + missing]
    with pytest.raises(HorizonError, match=f"ckpt: .*has no '{NAME + missing}'"):
        _read(_write(tmp_path, parts))


@pytest.mark.parametrize("part", ["_blocks", "_scales"])
def test_read_refuses_a_wrong_dtype(tmp_path, part):
    parts = _parts()
    parts[NAME + part] = parts[NAME + part].to(torch.int16)
    with pytest.raises(HorizonError, match=f"'{NAME + part}' is torch.int16"):
        _read(_write(tmp_path, parts))


def test_read_refuses_unpaired_or_unpacked_parts(tmp_path):
    parts = _parts()
    parts[NAME + "_scales"] = parts[NAME + "_scales"][:, :4].contiguous()
    with pytest.raises(HorizonError, match=f"'{NAME}_blocks' \\[2, 8, 2, 16\\] and '{NAME}_scales' \\[2, 4, 2\\]"):
        _read(_write(tmp_path, parts))
    parts = _parts()
    parts[NAME + "_blocks"] = parts[NAME + "_blocks"].reshape(E, OUT, IN // 16, 8)
    parts[NAME + "_scales"] = torch.full((E, OUT, IN // 16), 127, dtype=torch.uint8)
    with pytest.raises(HorizonError, match=f"'{NAME}_blocks'.* are not MXFP4 parts"):
        _read(_write(tmp_path, parts))


def test_read_refuses_a_shape_other_than_the_models(tmp_path):
    p = _write(tmp_path, _parts())
    with pytest.raises(HorizonError, match=f"'{NAME}' is stored as \\[2, 64, 8\\].*the model's is \\[2, 8, 64\\]"):
        _read(p, shape=(E, OUT, IN))  # the stored orientation, not the held one


def test_read_refuses_a_nan_scale(tmp_path):
    parts = _parts()
    parts[NAME + "_scales"][1, 3, 0] = 255
    with pytest.raises(HorizonError, match=f"'{NAME}_scales' has a scale of 255"):
        _read(_write(tmp_path, parts))
