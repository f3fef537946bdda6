"""A whole step worked out on paper: a 2-layer model on a toy machine with round rates.

Toy machine: 1 TFLOP/s effective compute (bf16 peak 1, matmul efficiency 1), HBM so fast
(1e21 B/s) that the elementwise term a compute op adds to its FLOP term (its hbm_bytes, a few MB
at most here, / 1e21 B/s < 1e-14 s) is below this test's tolerance, zero launch overhead; link 1 GB/s each way, zero latency; CPU AdamW
0.1 Gparam/s; DRAM 1 PB/s, far above everything that shares it (so nothing slows down on the
bus, and host-only ops take ~1e-10 s, which is still counted).

Toy model: 2 blocks, hidden H=64, 4 heads of 16 (q = kv = 64, plain MHA), SwiGLU F=128,
vocab V=256, untied, RMSNorm. Policy: K=1, 2 slots, checkpoints on device, optimizer 'after',
one micro-batch of 1 sequence of T=512 tokens, bf16 compute with a bf16 host working copy,
fp32 master and moments, bf16 gradients on the link, grad clipping on.

Sizes (by hand):
  block params   = attention 4·H·H + MLP 3·H·F + two norms 2·H
                 = 16384 + 24576 + 128           = 41088    (bf16: 82176 B)
  block matmuls  = 16384 + 24576                 = 40960
  head (device)  = final norm H + LM head V·H    = 64 + 16384 = 16448 (bf16: 32896 B)
  embedding      = V·H                           = 16384
  boundary act.  = T·H·2 B                       = 65536 B
FLOPs (by hand; causal attention runs half of QK^T and AV):
  block forward  = 2·40960·512 + (4·T·q·T)/2 = 41943040 + 33554432 = 75497472
  block backward = 3 x forward (forward-with-grad + 2x for the grads) = 226492416
  head fwd+bwd   = 3 · 2·V·H·T = 50331648
Durations (µs): load block 82.176, load head 32.896, load input 65.536;
  forward 75.497472, backward 226.492416, head 50.331648;
  offload block grads 82.176, head grads 32.896, input grad 65.536;
  optimizer = params / 1e8: emb 163.84, block 410.88, head 164.48.
  host ops (bytes / 1e15 B/s): embed gather T·H·(2 read + 2 write) = 131072 B -> 1.31072e-4 µs;
  embed scatter T·H·(2 + 2·2) + 2 sweeps over V·H bf16 grads = 196608 + 65536 = 262144 B;
  grad norm 4 units · 8 B = 32 B.

Schedule (ops in program order, lane, what each waits for besides its lane's previous op):
   0 embed_fwd        cpu
   1 load_input       h2d   0
   2 load_weights[0]  h2d   -             slot 0
   3 forward[0]       comp  2
   4 load_weights[1]  h2d   -             slot 1
   5 forward[1]       comp  4
   6 load_weights[h]  h2d   3 (slot 0 free once forward[0] is done)
   7 head             comp  6
   8 offload_grads[h] d2h   7
   9 backward[1]      comp  (4)           slot 1 still holds block 1: no reload
  10 offload_grads[1] d2h   9
  11 load_weights[0]  h2d   7 (slot 0 free once the head is done)
  12 backward[0]      comp  11, and 8: backpressure, at most 2 grad offloads in flight
  13 offload_grads[0] d2h   12
  14 offload_input_gr d2h   12
  15 embed_bwd        cpu   14
  16 grad_norm        cpu   13
  17-20 optimizer emb, 0, 1, head   cpu (after grad_norm)

Timeline (µs; e = 1.31072e-4, the embedding gather):
  op                 start                          end
   0 embed_fwd        0                              e
   1 load_input       e                              e + 65.536
   2 load_weights[0]  e + 65.536                     e + 147.712
   3 forward[0]       e + 147.712                    e + 223.209472
   4 load_weights[1]  e + 147.712                    e + 229.888
   5 forward[1]       max(223.209472, 229.888) + e   e + 305.385472
   6 load_weights[h]  max(229.888, 223.209472) + e   e + 262.784
   7 head             max(305.385472, 262.784) + e   e + 355.71712
   8 offload_grads[h] e + 355.71712                  e + 388.61312
   9 backward[1]      e + 355.71712                  e + 582.209536
  10 offload_grads[1] max(582.209536, 388.61312) + e e + 664.385536
  11 load_weights[0]  max(262.784, 355.71712) + e    e + 437.89312
  12 backward[0]      max(582.209536, 437.89312, 388.61312) + e  e + 808.701952
  13 offload_grads[0] max(808.701952, 664.385536) +e e + 890.877952
  14 offload_inp_grad e + 890.877952                 e + 956.413952
  15 embed_bwd        e + 956.413952                 + 2.62144e-4
  16 grad_norm        ...                            + 3.2e-11
  17 optimizer[emb]   ...                            + 163.84
  18 optimizer[0]                                    + 410.88
  19 optimizer[1]                                    + 410.88
  20 optimizer[head]                                 + 164.48   = 2106.494345... step
"""
import pytest

from horizon_sim.schedule import EMBED, OpKind, build_schedule
from horizon_sim.sim.simulate import simulate
from horizon_sim.specs.hardware import DeviceSpec, HardwareSpec, HostSpec, LinkSpec
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy

US = 1e-6

# ---- the toy machine, in round numbers -------------------------------------------------------
FLOPS_PER_S = 1e12
LINK_BPS = 1e9
ADAM_PARAMS_PER_S = 1e8
DRAM_BPS = 1e15

TOY_HW = HardwareSpec(
    device=DeviceSpec(name="toy-gpu", hbm_GiB=1000, bf16_TFLOPs=FLOPS_PER_S / 1e12, fp32_TFLOPs=1,
                      hbm_GBps=1e12, default_link="toy-link", matmul_efficiency=1.0,
                      launch_overhead_us=0),
    link=LinkSpec(name="toy-link", h2d_GBps=LINK_BPS / 1e9, d2h_GBps=LINK_BPS / 1e9, latency_us=0,
                  pageable_GBps=1),
    host=HostSpec(name="toy-host", ram_GiB=1000, dram_GBps=DRAM_BPS / 1e9, cores=1,
                  adam_Gparams_per_s=ADAM_PARAMS_PER_S / 1e9),
)
TOY_MODEL = ModelSpec(name="toy", n_layers=2, hidden=64, n_heads=4, n_kv_heads=4, ffn_hidden=128,
                      vocab=256)
TOY_POLICY = Policy(batch=1, seq=512, micro_batches=1, act_ckpt_every=1, slots=2, act_ckpt_on="device",
                    optimizer="after", compute_dtype="bf16", working_copy=True)

# ---- sizes and work, by hand ------------------------------------------------------------------
H, F, V, T = 64, 128, 256, 512
BLOCK_MATMUL = 4 * H * H + 3 * H * F          # 40960
BLOCK_PARAMS = BLOCK_MATMUL + 2 * H           # 41088
HEAD_PARAMS = H + V * H                       # 16448
EMB_PARAMS = V * H                            # 16384
BOUNDARY_B = T * H * 2                        # 65536
FWD_FLOPS = 2 * BLOCK_MATMUL * T + 4 * T * H * T / 2   # 75497472
BWD_FLOPS = 3 * FWD_FLOPS
HEAD_FLOPS = 3 * 2 * V * H * T

# durations, s
t_load_block = BLOCK_PARAMS * 2 / LINK_BPS    # 82.176 µs
t_load_head = HEAD_PARAMS * 2 / LINK_BPS      # 32.896 µs
t_boundary = BOUNDARY_B / LINK_BPS            # 65.536 µs
t_fwd = FWD_FLOPS / FLOPS_PER_S               # 75.497472 µs
t_bwd = BWD_FLOPS / FLOPS_PER_S               # 226.492416 µs
t_head = HEAD_FLOPS / FLOPS_PER_S             # 50.331648 µs
t_grads_block = BLOCK_PARAMS * 2 / LINK_BPS   # bf16 grads: 82.176 µs
t_grads_head = HEAD_PARAMS * 2 / LINK_BPS     # 32.896 µs
t_embed_fwd = T * H * (2 + 2) / DRAM_BPS      # read bf16 rows, write bf16 staging
t_embed_bwd = (T * H * (2 + 2 * 2) + 2 * EMB_PARAMS * 2) / DRAM_BPS
t_grad_norm = 4 * 8 / DRAM_BPS
t_opt = {EMBED: EMB_PARAMS / ADAM_PARAMS_PER_S, 0: BLOCK_PARAMS / ADAM_PARAMS_PER_S,
         1: BLOCK_PARAMS / ADAM_PARAMS_PER_S, 2: HEAD_PARAMS / ADAM_PARAMS_PER_S}


def _expected() -> dict[int, tuple[float, float]]:
    """(start, end) of every op, following the dependency rules: an op starts when its lane's
    previous op and every op it depends on have ended."""
    ev = {}

    def run(op_id, ready, dur):
        ev[op_id] = (ready, ready + dur)
        return ready + dur

    end = lambda i: ev[i][1]
    run(0, 0.0, t_embed_fwd)                                         # cpu
    run(1, end(0), t_boundary)                                       # h2d, waits for 0
    run(2, end(1), t_load_block)                                     # h2d
    run(3, end(2), t_fwd)                                            # compute, waits for 2
    run(4, end(2), t_load_block)                                     # h2d
    run(5, max(end(3), end(4)), t_fwd)                               # compute, waits for 4
    run(6, max(end(4), end(3)), t_load_head)                         # h2d, WAR on slot 0
    run(7, max(end(5), end(6)), t_head)                              # compute, waits for 6
    run(8, end(7), t_grads_head)                                     # d2h, waits for 7
    run(9, end(7), t_bwd)                                            # compute, block 1 resident
    run(10, max(end(8), end(9)), t_grads_block)                      # d2h, waits for 9
    run(11, max(end(6), end(7)), t_load_block)                       # h2d, WAR on slot 0
    run(12, max(end(9), end(11)), t_bwd)                             # compute, waits for 11
    run(13, max(end(10), end(12)), t_grads_block)                    # d2h
    run(14, max(end(13), end(12)), t_boundary)                       # d2h
    run(15, max(end(0), end(14)), t_embed_bwd)                       # cpu, waits for 14
    run(16, max(end(15), end(13)), t_grad_norm)                      # cpu
    t = end(16)
    for op_id, unit in zip((17, 18, 19, 20), (EMBED, 0, 1, 2)):     # cpu, in order
        t = run(op_id, t, t_opt[unit])
    return ev


@pytest.fixture(scope="module")
def sched():
    return build_schedule(TOY_MODEL, TOY_POLICY)


def test_toy_sizes_match_the_model_spec():
    assert TOY_MODEL.layer_params == BLOCK_PARAMS
    assert TOY_MODEL.head_device_params == HEAD_PARAMS
    assert TOY_MODEL.embedding_params == EMB_PARAMS


def test_schedule_is_the_one_worked_on_paper(sched):
    want = [
        (OpKind.EMBED_FWD, EMBED, ()), (OpKind.LOAD_INPUT, EMBED, (0,)), (OpKind.LOAD_WEIGHTS, 0, ()),
        (OpKind.FORWARD, 0, (2,)), (OpKind.LOAD_WEIGHTS, 1, ()), (OpKind.FORWARD, 1, (4,)),
        (OpKind.LOAD_WEIGHTS, 2, (3,)), (OpKind.HEAD, 2, (6,)), (OpKind.OFFLOAD_GRADS, 2, (7,)),
        (OpKind.BACKWARD, 1, (4,)), (OpKind.OFFLOAD_GRADS, 1, (9,)), (OpKind.LOAD_WEIGHTS, 0, (7,)),
        (OpKind.BACKWARD, 0, (8, 11)), (OpKind.OFFLOAD_GRADS, 0, (12,)), (OpKind.OFFLOAD_INPUT_GRAD, EMBED, (12,)),
        (OpKind.EMBED_BWD, EMBED, (14,)), (OpKind.GRAD_NORM, -1, (13,)),
        (OpKind.OPTIMIZER, EMBED, None), (OpKind.OPTIMIZER, 0, None), (OpKind.OPTIMIZER, 1, None),
        (OpKind.OPTIMIZER, 2, None),
    ]
    assert len(sched.ops) == len(want)
    for op, (kind, layer, deps) in zip(sched.ops, want):
        assert (op.kind, op.unit) == (kind, layer), op.label
        if deps is not None:
            assert op.deps == deps, op.label
        else:  # optimizer deps all point at ops that end before grad_norm does
            assert all(d < 16 for d in op.deps), op.label
    # slots as on paper
    assert [sched.ops[i].slot for i in (2, 3, 4, 5, 6, 7, 9, 11, 12)] == [0, 0, 1, 1, 0, 0, 1, 0, 0]


def test_op_work_matches_the_hand_numbers(sched):
    ops = sched.ops
    assert [ops[i].link_bytes for i in (1, 2, 4, 6, 11)] == [BOUNDARY_B] + [BLOCK_PARAMS * 2] * 2 + \
        [HEAD_PARAMS * 2, BLOCK_PARAMS * 2]
    assert [ops[i].link_bytes for i in (8, 10, 13, 14)] == [HEAD_PARAMS * 2, BLOCK_PARAMS * 2,
                                                            BLOCK_PARAMS * 2, BOUNDARY_B]
    assert [ops[i].flops for i in (3, 5, 7, 9, 12)] == [FWD_FLOPS, FWD_FLOPS, HEAD_FLOPS, BWD_FLOPS,
                                                        BWD_FLOPS]
    assert [ops[i].params for i in (17, 18, 19, 20)] == [EMB_PARAMS, BLOCK_PARAMS, BLOCK_PARAMS,
                                                         HEAD_PARAMS]
    assert ops[0].host_bytes == T * H * 4
    assert ops[15].host_bytes == T * H * 6 + 2 * EMB_PARAMS * 2
    assert ops[16].host_bytes == 32


def test_simulated_timeline_equals_the_hand_worked_one(sched):
    tl = simulate(sched, TOY_HW).timeline.set_index("op_id")
    want = _expected()
    assert sorted(want) == list(tl.index)
    for op_id, (start, end) in want.items():
        label = sched.ops[op_id].label
        assert tl.at[op_id, "start_s"] == pytest.approx(start, abs=1e-9), label
        assert tl.at[op_id, "end_s"] == pytest.approx(end, abs=1e-9), label
    # a few of the numbers from the docstring table, in µs, to keep the table honest
    e = t_embed_fwd / US
    assert tl.at[5, "start_s"] / US == pytest.approx(229.888 + e, abs=1e-6)
    assert tl.at[7, "end_s"] / US == pytest.approx(355.71712 + e, abs=1e-6)
    assert tl.at[12, "end_s"] / US == pytest.approx(808.701952 + e, abs=1e-6)
    assert tl.at[14, "end_s"] / US == pytest.approx(956.413952 + e, abs=1e-6)


def test_summary_of_the_hand_worked_step(sched):
    r = simulate(sched, TOY_HW)
    step = max(end for _, end in _expected().values())
    assert step / US == pytest.approx(956.413952 + 163.84 + 2 * 410.88 + 164.48, abs=1e-3)
    s = r.summary
    assert s.step_time_s == pytest.approx(step, abs=1e-9)
    assert s.tokens_per_s == pytest.approx(T / step, rel=1e-9)
    busy_compute = 2 * t_fwd + t_head + 2 * t_bwd
    assert s.lane_busy["compute"] == pytest.approx(busy_compute / step, rel=1e-9)
    assert s.lane_busy["h2d"] == pytest.approx((t_boundary + 3 * t_load_block + t_load_head) / step,
                                               rel=1e-9)
    # the step ends with the CPU optimizer running alone: that is what limits it
    assert s.bottleneck == "cpu optimizer"
    assert s.exposed_optimizer_s == pytest.approx(sum(t_opt.values()), rel=1e-6)
