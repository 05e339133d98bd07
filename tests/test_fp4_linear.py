"""kernels.fp4_linear: the FP4 training recipe's six operands bit for bit against the quantizers'
references, the layer's forward and backward against the float64 recipe, 16x16 tiles giving W and W^T
the same values, stochastic rounding unbiased, wrong recipes caught, bad arguments refused by name."""

import dataclasses

import pytest
import torch

from kernels import fp4, hadamard
from kernels import fp4_linear as F
from kernels.device import default_device

DEVICE = default_device()
RECIPES = {
    "nvfp4": F.FP4Recipe(),
    "nvfp4 no SR": F.FP4Recipe(stochastic_rounding=False),
    "nvfp4 no RHT": F.FP4Recipe(rht=False),
    "nvfp4 1x16 weights": F.FP4Recipe(weight_tiles=False),
    "mxfp4": F.FP4Recipe("mxfp4", weight_tiles=False),
}


def _data(recipe, tokens=64, d_in=64, d_out=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens // 16, 16, d_in, generator=g).to(torch.bfloat16)
    x[1, 3, 5] = 40.0  # an outlier token element: what the rotation is for
    w = torch.randn(d_out, d_in, generator=g) * 0.05
    b = torch.randn(d_out, generator=g)
    dy = (torch.randn(tokens // 16, 16, d_out, generator=g) * 1e-3).to(torch.bfloat16)
    return x.to(DEVICE), w.to(DEVICE), b.to(DEVICE), dy.to(DEVICE)


def _bits(q: fp4.FP4Tensor) -> tuple:
    ts = None if q.tensor_scale is None else q.tensor_scale.view(torch.int32).item()
    return q.q.cpu(), q.s.view(torch.uint8).cpu(), ts


def _same(a: fp4.FP4Tensor, b: fp4.FP4Tensor) -> bool:
    (aq, as_, at), (bq, bs, bt) = _bits(a), _bits(b)
    return torch.equal(aq, bq) and torch.equal(as_, bs) and at == bt


@pytest.mark.parametrize("name", list(RECIPES))
def test_the_six_operands_are_the_references_bit_for_bit(name):
    r = RECIPES[name]
    x, w, _, dy = _data(r)
    x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
    got, want = F.operands(x2, w, dy2, r, step=5), F.operands(x2, w, dy2, r, step=5, reference=True)
    for role in F.ROLES:
        assert _same(got[role], want[role]), f"{name}: operand {role} differs"


def test_16x16_tiles_give_w_and_its_transpose_the_same_values():
    w = torch.randn(48, 80, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    w[7, 70] = 30.0
    tiled = F._transpose_tiles(fp4.quantize_nvfp4(w, block_2d=True))
    again = fp4.quantize_nvfp4(w.t().contiguous(), block_2d=True)  # W^T quantized from the wide weight
    assert _same(tiled, again)
    assert torch.equal(fp4.dequantize_fp4(tiled), fp4.dequantize_fp4(fp4.quantize_nvfp4(w, block_2d=True)).t())
    # 1x16 blocks do not have the property: the backward would see other weights than the forward
    rows = fp4.dequantize_fp4(fp4.quantize_nvfp4(w)).t()
    cols = fp4.dequantize_fp4(fp4.quantize_nvfp4(w.t().contiguous()))
    assert not torch.equal(rows, cols)


def _within(got, exact, mag, unit, name, inner=2.0**-20):
    """|got - exact| <= unit * |exact| (the output's rounding) + inner * mag (the fp32 sum, K <= 4096, and
    any rounding before the last)."""
    err = (got.double() - exact).abs()
    bound = unit * exact.abs() + inner * mag
    worst = (err - bound).max().item()
    assert worst <= 0, f"{name}: error exceeds the rounding bound by {worst:.3e} (max error {err.max().item():.3e})"


def _magnitudes(q, a, b) -> torch.Tensor:
    """|A| |B|^T of two quantized operands, times their tensor scales: the size of every product summed."""
    absq = {k: v._replace(q=fp4.pack(fp4.unpack(v.q) & 7)) for k, v in q.items() if k in (a, b)}
    return F._gemm_reference(absq[a], absq[b])


@pytest.mark.parametrize("name", list(RECIPES))
def test_forward_and_backward_meet_the_float64_recipe(name):
    r = RECIPES[name]
    x, w, b, dy = _data(r, seed=2)
    x, w, b = (t.clone().requires_grad_() for t in (x, w, b))
    y = F.fp4_linear(x, w, b, r, step=9)
    y.backward(dy)
    ry, rdx, rdw, rdb = F.fp4_linear_reference(x.detach(), w.detach(), dy, r, b.detach(), step=9)
    q = F.operands(x.detach().reshape(-1, 64), w.detach(), dy.reshape(-1, 96), r, step=9, reference=True)
    bf16, fp32 = 2.0**-8, 2.0**-24
    # y: the GEMM rounded to bf16 (at most bf16 of the GEMM's magnitudes), the bias added, rounded again
    _within(y, ry, _magnitudes(q, "x", "w").reshape(ry.shape), bf16, "y", inner=bf16)
    _within(x.grad, rdx, _magnitudes(q, "dy", "wt").reshape(rdx.shape), bf16, "dx")
    _within(w.grad, rdw, _magnitudes(q, "dyt", "xt"), fp32, "dw")
    assert torch.allclose(b.grad.double(), rdb, rtol=1e-5, atol=1e-6)


def test_a_wrong_recipe_is_caught():
    """The checks above tell a recipe from its mistakes: nearest rounding where the recipe rounds
    stochastically, the rotation on one wgrad operand only, and X^T made from the forward's FP4 codes."""
    r = RECIPES["nvfp4"]
    x, w, _, dy = _data(r, seed=3)
    x2, dy2 = x.reshape(-1, 64), dy.reshape(-1, 96)
    want = F.operands(x2, w, dy2, r, step=1, reference=True)
    nearest = F._quantize(dy2, r)
    assert not torch.equal(nearest.q, want["dy"].q), "nearest rounding must differ from stochastic rounding"
    one_sided = F._quantize(F._rotated(dy2.t().contiguous(), r), r, seed=r.step_seeds(1)[1])
    xt_unrotated = F._quantize(x2.t().contiguous(), r)
    exact = F._gemm_reference(want["dyt"], want["xt"])
    wrong = F._gemm_reference(one_sided, xt_unrotated)
    assert (wrong - exact).abs().max() > 0.1 * exact.abs().max(), "a rotation of one operand changes the product"
    # X^T from the forward's codes: the scales run along the wrong axis
    from_codes = fp4.dequantize_fp4(F._quantize(x2, r)).t().contiguous()
    assert not torch.equal(_bits(F._quantize(from_codes, r))[0], _bits(F._quantize(x2.t().contiguous(), r))[0])


def test_stochastic_rounding_makes_the_gradient_unbiased():
    """Averaged over steps (each its own random bits), dX with stochastic rounding of dY approaches dY W
    with only W quantized; nearest rounding keeps its error however many steps are averaged."""
    r = F.FP4Recipe(rht=False)
    x, w, _, dy = _data(r, tokens=32, d_in=32, d_out=32, seed=4)
    dy2 = dy.reshape(-1, 32)
    wt = F._transpose_tiles(F._quantize(w, r, tiles=True))
    wide = dy2.double() @ fp4.dequantize_fp4(wt).double().t()
    steps = 96
    mean = sum(
        F.fp4_gemm(F._quantize(dy2, r, seed=r.step_seeds(s)[0]), wt, torch.float32).double() for s in range(steps)
    )
    mean = mean / steps
    nearest = F.fp4_gemm(F._quantize(dy2, r), wt, torch.float32).double()
    err_sr, err_rne = (mean - wide).norm().item(), (nearest - wide).norm().item()
    assert err_sr < 0.4 * err_rne, (err_sr, err_rne)


def test_bad_arguments_are_refused_by_name():
    r = F.FP4Recipe()
    x, w = torch.zeros(16, 32, device=DEVICE), torch.zeros(32, 32, device=DEVICE)
    cases = [
        (lambda: F.FP4Recipe("fp4"), ValueError, "fmt"),
        (lambda: F.FP4Recipe("mxfp4"), ValueError, "weight_tiles"),
        (lambda: F.FP4Recipe(rht=1), TypeError, "rht"),
        (lambda: F.FP4Recipe(seed=-1), ValueError, "seed"),
        (lambda: F.fp4_linear(x, w, recipe="nvfp4"), TypeError, "recipe"),
        (lambda: F.fp4_linear(x.long(), w), TypeError, "x"),
        (lambda: F.fp4_linear(x, w[:, :16]), ValueError, "in_features"),
        (lambda: F.fp4_linear(torch.zeros(16, 24, device=DEVICE), torch.zeros(32, 24, device=DEVICE)), ValueError,
         "multiples of 16"),
        (lambda: F.fp4_linear(torch.zeros(8, 32, device=DEVICE), w), ValueError, "tokens"),
        (lambda: F.fp4_linear(x, w, torch.zeros(3, device=DEVICE)), ValueError, "bias"),
        (lambda: F.FP4Linear(32, 40), ValueError, "multiples of 16"),
        (lambda: F.swap_linears(torch.nn.Sequential(torch.nn.Linear(32, 32)), r, keep=["head"]), ValueError,
         "head"),
    ]  # fmt: skip
    for call, error, word in cases:
        with pytest.raises(error, match=word):
            call()


def test_the_module_counts_its_steps_and_swap_keeps_what_it_is_told():
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32)).to(DEVICE)
    w0 = model[0].weight
    F.swap_linears(model, F.FP4Recipe(), keep=["2"])
    assert type(model[0]) is F.FP4Linear and type(model[2]) is torch.nn.Linear and model[0].weight is w0
    x = torch.randn(16, 32, device=DEVICE)
    model(x).sum().backward()
    assert model[0].step == 1 and w0.grad is not None
    model.eval()
    with torch.no_grad():
        model(x)
    assert model[0].step == 1, "evaluation does not draw stochastic-rounding bits"


def test_the_layer_is_the_same_with_the_kernels_and_with_their_references():
    """FP4Recipe(reference=True), what CPU-mode training runs use, changes nothing but the quantizers:
    the layer's output and gradients are the same bits."""
    for name, r in RECIPES.items():
        x, w, b, dy = _data(r, seed=6)
        results = []
        for recipe in (r, dataclasses.replace(r, reference=True)):
            xi, wi, bi = (t.clone().requires_grad_() for t in (x, w, b))
            F.fp4_linear(xi, wi, bi, recipe, step=2).backward(dy)
            results.append([t.detach() for t in (F.fp4_linear(x, w, b, recipe, step=2), xi.grad, wi.grad, bi.grad)])
        for got, want in zip(*results, strict=True):
            assert torch.equal(got, want), name


def test_a_training_run_is_the_same_with_the_kernels_and_with_their_references():
    """Two steps of the character model with its first block in FP4.  In CPU mode every operation is
    deterministic and the two runs agree bit for bit; on a GPU the attention's and the norms' backward
    sum in an order that may vary, so the second loss agrees closely and the first exactly."""
    kw = {"steps": 2, "batch": 2, "model_args": {"dim": 32, "layers": 2, "heads": 2, "context": 32}}
    kernels_run = F.train(F.FP4Recipe(), device=DEVICE, **kw)
    references_run = F.train(F.FP4Recipe(reference=True), device=DEVICE, **kw)
    bf16_run = F.train(None, device=DEVICE, **kw)
    if DEVICE == "cpu":
        assert kernels_run["loss"] == references_run["loss"]
    else:
        assert kernels_run["loss"][0] == references_run["loss"][0]
        assert abs(kernels_run["loss"][1] - references_run["loss"][1]) < 1e-3 * kernels_run["loss"][1]
    assert kernels_run["loss"][1] != bf16_run["loss"][1], "the FP4 layers took part"


def test_train_keeps_the_sensitive_layers_wide_unless_told(monkeypatch):
    from kernels import charmodel

    preparations = []
    monkeypatch.setattr(charmodel, "train", lambda recipe, prepare=None, **kw: preparations.append(prepare))
    swapped = {}
    for keep in (True, False):
        F.train(F.FP4Recipe(), keep_sensitive=keep)
        model = charmodel.CharTransformer(96, dim=32, layers=2, heads=2, context=16)
        preparations[-1](model)
        swapped[keep] = {n for n, m in model.named_modules() if isinstance(m, F.FP4Linear)}
    assert swapped[True] == {f"blocks.0.{n}" for n in ("qkv", "proj", "up", "down")}
    assert swapped[False] == swapped[True] | set(F.sensitive_layers(model))
    assert "head" in swapped[False], "the corpus's 96 characters are a multiple of 16 and of 32"
    from kernels import fp8_linear

    F.train(fp8_linear.FP8Recipe())
    model = charmodel.CharTransformer(96, dim=32, layers=2, heads=2, context=16)
    preparations[-1](model)
    fp8 = {n for n, m in model.named_modules() if isinstance(m, fp8_linear.FP8Linear)}
    assert fp8 == swapped[True], "chapter 5's layer takes the same places"
    with pytest.raises(TypeError, match="recipe"):
        F.train("nvfp4")


def test_the_verdicts_apply_the_one_and_three_percent_rule():
    def run(*losses):
        return {"loss": list(losses), "steps": [10 * i for i in range(len(losses))]}

    runs = {
        "bf16": run(4.0, 2.0, 2.0),
        "good": run(4.0, 2.0, 2.01),
        "lower": run(4.0, 2.0, 1.95),
        "a bit lower": run(4.0, 2.0, 1.99),
        "so-so": run(4.0, 2.0, 2.05),
        "bad": run(4.0, 2.0, 2.20),
        "spike": run(4.0, 9.0, 2.0),  # came back: judged by its final loss
        "blows up": run(4.0, 2.0, 9.0, 9.5),
        "nan": run(4.0, float("nan"), float("nan")),
        "starts above": run(5.5, 2.0, 2.0),  # an untrained model may begin worse than a uniform guess
        "never trains": run(5.5, 5.6, 5.7),
    }
    rows = {name: (verdict, at) for name, _, _, verdict, at in F.verdicts(runs, "bf16", limit=5.0, tail=1)}
    assert rows == {
        "bf16": ("within 1%", None),
        "good": ("within 1%", None),
        "lower": ("below bf16", None),
        "a bit lower": ("within 1%", None),
        "so-so": ("1-3%", None),
        "bad": ("over 3%", None),
        "spike": ("within 1%", None),
        "blows up": ("diverged", 20),
        "nan": ("diverged", 10),
        "starts above": ("within 1%", None),
        "never trains": ("diverged", 0),
    }
    with pytest.raises(ValueError, match="base"):
        F.verdicts(runs, "fp32", limit=5.0)


def test_spikes_are_the_losses_that_rose_above_the_limit_and_came_back():
    steps = [0, 10, 20, 30, 40, 50]
    assert F.spikes([5.5, 2.0, 7.0, 2.0, float("nan"), 2.0], steps, limit=5.0) == [20, 40]
    assert F.spikes([5.5, 5.2, 2.0, 2.0, 2.0, 2.0], steps, limit=5.0) == [], "a slow start is no spike"
    assert F.spikes([4.0, 7.0, 2.0, 2.0, 9.0, 9.0], steps, limit=5.0) == [10], "the divergence at 40 is not one"
    with pytest.raises(ValueError, match="one entry each"):
        F.diverged_at([1.0], steps, limit=5.0)


def test_lab_6_q5s_answer_is_the_layers():
    """Lab 6 q5's check (kernels.checks.lab06.check_fp4_backward) wants the layer's own backward operands."""
    from kernels.checks import lab06

    recipe, step = F.FP4Recipe(seed=3), 4
    x, dy, _, _ = lab06.backward_inputs()
    x, dy = x.to(DEVICE), dy.to(DEVICE)
    signs = hadamard.random_signs(16, recipe.seed)
    want = lab06.backward_reference(x, dy, recipe.step_seeds(step), signs.to(DEVICE))
    layer = F.operands(x, torch.zeros(32, x.shape[1], device=DEVICE), dy, recipe, step)
    for role, key in (("dY", "dy"), ("dY^T", "dyt"), ("X^T", "xt")):
        assert torch.equal(want[role].q.cpu(), layer[key].q.cpu()), role
        assert torch.equal(want[role].s.view(torch.uint8).cpu(), layer[key].s.view(torch.uint8).cpu()), role
