"""kernels.distributed: FSDP2 over gloo processes on the CPU (both lanes; two GPUs would run NCCL).

Each launch starts processes that import torch and the package (several seconds), so the experiments run
few steps of the chapter's small model and each test asks as much of one launch as it can."""

import pytest
import torch
import torch.distributed as dist

from kernels import distributed as D
from kernels import quantize as Q
from kernels.fp8_linear import FP8Linear, FP8LinearFunction, FP8Recipe, MarkovLM


def collectives_worker(rank, world_size):
    """Known collectives, counted: an all-gather of 3 fp32 elements a rank, a reduce-scatter of 8 bf16
    elements, an all-reduce of 5 fp32 elements, then one outside the block."""
    with D.count_collectives() as counts:
        out = torch.empty(3 * world_size)
        dist.all_gather_into_tensor(out, torch.full((3,), float(rank)))
        part = torch.empty(8 // world_size, dtype=torch.bfloat16)
        dist.reduce_scatter_tensor(part, torch.ones(8, dtype=torch.bfloat16))
        dist.all_reduce(torch.ones(5))
    dist.all_reduce(torch.ones(7))
    return counts, out, part


def test_count_collectives_counts_each_kind_and_only_inside_the_block():
    results = D.launch(collectives_worker, 2)
    for counts, out, part in results:
        assert counts == {
            "all-gather": {"calls": 1, "bytes": 3 * 2 * 4},
            "reduce-scatter": {"calls": 1, "bytes": 8 * 2},
            "all-reduce": {"calls": 1, "bytes": 5 * 4},
        }
        assert out.tolist() == [0.0] * 3 + [1.0] * 3
        assert part.tolist() == [2.0] * 4


def test_the_reduction_alone_costs_bf16_digits_and_fp32_none():
    errors = D.reduction_errors((1, 2))
    # One rank: FSDP2's gradient is the plain bf16 copy's, bit for bit (what the comparison relies on);
    # the fp32 norms' gradients are rounded when reduced in bf16.
    assert errors[1]["fp32"] == 0.0
    assert 0 < errors[1]["bf16"] < 2.0**-10
    # Two ranks: one fp32 addition of two bf16 gradients is nearly exact; a bf16 one rounds to 8 bits.
    assert errors[2]["fp32"] < 2.0**-24
    assert 2.0**-12 < errors[2]["bf16"] < 2.0**-7


def test_fp8_all_gather_halves_the_weights_bytes_and_changes_no_bit():
    steps = 2
    ranks = D.launch(D.fp8_gather_experiment, 2, (steps,))
    for r in ranks:
        bf16, fp8 = r["bf16"], r["fp8"]
        assert bf16["losses"] == fp8["losses"]
        assert all(torch.equal(x, y) for x, y in zip(bf16["grads"], fp8["grads"], strict=True))
        assert torch.equal(bf16["seen"], fp8["seen"])
    runs = ranks[0]
    # The FP8Linear weights (2 blocks x (64x256 + 256x64)) travel twice a step (forward, and again for
    # the backward), at 1 byte instead of 2; everything else travels as before.
    fp8_weights = 2 * 2 * 64 * 256
    gathered = {g: r["collectives"]["all-gather"]["bytes"] for g, r in runs.items()}
    assert gathered["bf16"] - gathered["fp8"] == 2 * fp8_weights
    assert gathered["fp8"] == gathered["fp8, own scales"]
    assert runs["fp8"]["collectives"]["all-reduce"]["calls"] == 2 * 4  # one amax per weight and gather
    assert "all-reduce" not in runs["fp8, own scales"]["collectives"]
    assert "all-reduce" not in runs["bf16"]["collectives"]
    # Without an agreed scale each rank reads every shard with its own shard's scale: a weight no rank
    # holds, and a different one on each rank.
    own = [r["fp8, own scales"] for r in ranks]
    for r in own:
        assert float((r["seen"] - r["truth"]).norm() / r["truth"].norm()) > 0.3
    assert not torch.equal(own[0]["seen"], own[1]["seen"])
    assert own[0]["losses"] != runs["fp8"]["losses"]
    with pytest.raises(ValueError, match="gathers must be among"):
        D.fp8_gather_experiment(0, 1, 1, ("fp4",))


def test_delayed_scaling_histories_agree_on_every_rank_only_when_reduced():
    ranks = D.launch(D.amax_experiment, 2, (3,))
    agreed = [r[True]["histories"] for r in ranks]
    own = [r[False]["histories"] for r in ranks]
    assert set(agreed[0]) == {"ups.0", "ups.1", "downs.0", "downs.1"}
    for name in agreed[0]:
        for role in ("x", "w", "dy"):
            assert torch.equal(agreed[0][name][role], agreed[1][name][role])
            assert (agreed[0][name][role][:3] > 0).all()
        # The weights are the same on every rank (FSDP2 gathers them), so their amaxes agree anyway; the
        # activations and gradients come from each rank's own data.
        assert torch.equal(own[0][name]["w"], own[1][name]["w"])
        assert not torch.equal(own[0][name]["x"], own[1][name]["x"])


def test_training_under_fsdp2_holds_16_bytes_a_parameter_spread_over_the_ranks():
    out = D.training_drift(steps=3, world_size=2)
    # fp32 master shard, fp32 gradient shard, AdamW's two fp32 moments: 16 bytes, half on each rank.
    assert out["held"] == {"params": 2.0, "grads": 2.0, "optimizer": 4.0}
    runs = out["runs"]
    assert runs["one process, fp32"]["drift"] == 0.0
    for name in ("one process, bf16", "FSDP2 x2, reduce fp32", "FSDP2 x2, reduce bf16"):
        assert 0 < runs[name]["drift"] < 0.05, name


def test_launch_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="world_size must be a positive int"):
        D.launch(collectives_worker, 0)
    with pytest.raises(ValueError, match="backend must be one of"):
        D.launch(collectives_worker, 2, backend="mpi")
    if torch.cuda.device_count() < 64:
        with pytest.raises(ValueError, match="needs 64 GPUs"):
            D.launch(collectives_worker, 64, backend="nccl")

    def local(rank, world_size):
        return rank

    with pytest.raises(ValueError, match="top level of an importable module"):
        D.launch(local, 2)


def test_fp8_all_gather_and_agree_amax_refuse_layers_they_cannot_serve():
    plain = torch.nn.Sequential(torch.nn.Linear(16, 16))
    with pytest.raises(ValueError, match="no FP8Linear layer"):
        D.fp8_all_gather(plain)
    with pytest.raises(ValueError, match="no FP8Linear layer with delayed scaling"):
        D.agree_amax(MarkovLM(fp8_recipe=FP8Recipe(), device="cpu"))
    for recipe in (FP8Recipe(granularity="row"), FP8Recipe(scaling="delayed")):
        with pytest.raises(ValueError, match="granularity='tensor' and scaling='current'"):
            D.fp8_all_gather(torch.nn.Sequential(FP8Linear(16, 16, device="cpu", recipe=recipe)))


def test_a_gathered_weight_reads_as_its_dequantized_value_and_names_a_format_mismatch():
    q = torch.tensor([[1.0, -2.0], [0.5, 448.0]]).to(torch.float8_e4m3fn)
    s = torch.tensor(0.25)
    w = D.FP8GatheredWeight(q, s, "e4m3", torch.bfloat16)
    assert w.dtype == torch.bfloat16 and w.shape == (2, 2)
    assert torch.equal(w + 0, torch.tensor([[0.25, -0.5], [0.125, 112.0]], dtype=torch.bfloat16))
    assert isinstance(w.detach(), D.FP8GatheredWeight) and w.t().shape == (2, 2)
    assert w.fp8_operand("e4m3") == (q, s)
    with pytest.raises(ValueError, match="gathered as e4m3 codes; the layer's recipe wants e5m2"):
        w.fp8_operand("e5m2")
    x = torch.ones(3, 2)
    with pytest.raises(ValueError, match="one scale per tensor"):
        FP8LinearFunction.apply(x, w, None, FP8Recipe(granularity="row"), None)


def test_agree_is_the_identity_without_a_group():
    state = Q.DelayedScaling(4, device="cpu")
    amax = torch.tensor(3.0)
    assert state.group is None and state.agree(amax) is amax


def test_the_step_timer_runs_each_gather_and_the_one_device_baseline():
    # Timed on two GPUs with NCCL; here a tiny model on gloo, for the code path (the times mean nothing).
    ranks = D.launch(D.step_time_experiment, 2, (1, ("bf16", "fp8", "one device"), 32, 1, 16))
    r0, r1 = ranks
    assert all(r0[g]["ms"] > 0 for g in r0) and r1["one device"]["ms"] is None
    assert r0["one device"]["bytes"] == 0
    assert r0["bf16"]["bytes"] - r0["fp8"]["bytes"] == 2 * (32 * 128 * 2)  # two FP8 weights, gathered twice


TWO_GPUS = pytest.mark.skipif(
    torch.cuda.device_count() < 2,
    reason=f"needs two GPUs (NCCL, one rank a GPU); this machine has {torch.cuda.device_count()}",
)


@TWO_GPUS
def test_on_two_gpus_fp8_all_gather_changes_no_bit_and_the_step_is_timed():
    ranks = D.launch(D.fp8_gather_experiment, 2, (2, ("bf16", "fp8")), backend="nccl")
    for r in ranks:
        assert r["bf16"]["losses"] == r["fp8"]["losses"]
        assert all(torch.equal(x, y) for x, y in zip(r["bf16"]["grads"], r["fp8"]["grads"], strict=True))
    gathered = {g: ranks[0][g]["collectives"]["all-gather"]["bytes"] for g in ("bf16", "fp8")}
    assert gathered["bf16"] - gathered["fp8"] == 2 * 2 * 2 * 64 * 256
    times = D.launch(D.step_time_experiment, 2, (2, ("bf16", "fp8", "one device"), 256, 1, 256), backend="nccl")
    assert all(times[0][g]["ms"] > 0 for g in ("bf16", "fp8", "one device"))
