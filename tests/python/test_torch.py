"""dea.torch.DualExpertAttention: torch.autograd.gradcheck in double, agreement with the reference layer's PyTorch
code (bench/torch_dea.py) and with the golden cases (loaded with load_state_dict), the gradient isolation of the
reference's graph, the same bits on 1 and 2 threads, argument errors, shared parameter storage. Skipped (exit 77)
when torch is not installed."""
import copy
import glob
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import raises  # noqa: E402

np = harness.skip_unless("numpy")
torch = harness.skip_unless("torch")
import dea  # noqa: E402
import dea.torch  # noqa: E402

sys.path.insert(0, harness.BENCH)
sys.dont_write_bytecode = True
import torch_dea  # noqa: E402  (bench/torch_dea.py: the reference layer re-created in PyTorch)

B, T, D, H = 2, 4, 8, 2
MAIN = ["W_q.weight", "W_q.bias", "W_k.weight", "W_k.bias", "W_v.weight", "W_v.bias", "W_o.weight", "W_o.bias",
        "W_rel"]
GATE = ["W_gate", "c_gate"]


def module(dtype=torch.float64, **kw):
    torch.manual_seed(11)
    return dea.torch.DualExpertAttention(D, H, dropout=0.0, dtype=dtype, **kw)


def inputs(dtype=torch.float64, labelled=0.7, b=B, t=T, seed=5):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, t, D, dtype=dtype, generator=g)
    a = torch.rand(b, t, t, dtype=dtype, generator=g)
    a[torch.rand(b, t, t, generator=g) > labelled] = float("nan")
    km = torch.ones(b, t, dtype=torch.bool)
    km[-1, -1] = False
    return x, a, km


def params(m, names):
    return [dict(m.named_parameters())[n] for n in names]


def fd_worst(f, tensors, eps=1e-6):
    """max over tensors of max |central difference of the scalar f() - autograd| / max |autograd| (absolute when the
    gradient is ~0), every entry."""
    for t in tensors:
        t.grad = None
    f().backward()
    worst = 0.0
    with torch.no_grad():
        for t in tensors:
            g = t.grad.clone()
            flat = t.view(-1)
            scale = float(g.abs().max())
            scale = scale if scale > 1e-8 else 1.0
            for k in range(flat.numel()):
                old = float(flat[k])
                flat[k] = old + eps
                fp = float(f())
                flat[k] = old - eps
                fm = float(f())
                flat[k] = old
                worst = max(worst, abs((fp - fm) / (2 * eps) - float(g.view(-1)[k])) / scale)
    return worst


# ---- gradcheck (double)


def test_gradcheck_task_path():
    """output against x and every main parameter. With gamma_mix = 1 and every real key labelled, the scores use the
    oracle alone, so the output does not depend on alpha-hat (which the reference's graph reads as a constant) and
    finite differences see exactly the graph's derivative."""
    m = module()
    x, a, km = inputs(labelled=1.0)
    x.requires_grad_(True)
    R = torch.randn(B, T, D, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    ps = params(m, MAIN)

    def f(x, *ps):
        return (m(x, km, a, gamma_mix=1.0)["output"] * R).sum()

    assert torch.autograd.gradcheck(f, [x] + ps, eps=1e-6, atol=1e-8, rtol=1e-6)
    worst = fd_worst(lambda: f(x, *ps), [x] + ps)
    print("  task path: max relative error %.2e over x and %d parameters" % (worst, len(ps)))
    assert worst <= 1e-6


def test_gradcheck_gate_loss():
    m = module()
    x, a, km = inputs()
    t = torch.tensor([[1, -1, 3, 0], [2, 2, -1, 1]])
    ps = params(m, GATE)

    def f(*ps):
        return m(x, km, a, t, gamma_mix=0.3)["loss_gate"]

    assert float(f(*ps)) > 0
    assert torch.autograd.gradcheck(f, ps, eps=1e-6, atol=1e-8, rtol=1e-6)
    worst = fd_worst(lambda: f(*ps), ps)
    print("  gate loss: max relative error %.2e over W_gate, c_gate" % worst)
    assert worst <= 1e-6


def test_gradcheck_alpha_hat():
    """A loss read from alpha_hat (a random projection) against W_gate and c_gate, with and without an oracle. The
    reference's gate reads q, k and the normalised experts detached, so these two are all alpha_hat's graph reaches
    (x is left out: finite differences in x would see the detached path). The inputs keep every logit inside the
    +-10 clip and every alpha_hat below the 0.95 cap, away from the kinks, which the test checks."""
    m = module()
    x, a, km = inputs()
    R = torch.randn(B, H, T, T, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    ps = params(m, GATE)
    for oracle in (a, None):
        def f(*ps):
            return (m(x, km, oracle, gamma_mix=0.3)["alpha_hat"] * R).sum()

        ah = m(x, km, oracle, gamma_mix=0.3)["alpha_hat"].detach()
        assert 1e-3 < float(ah.min()) and float(ah.max()) < 0.94, "inputs near a kink"
        assert m(x, km, oracle)["alpha_hat"].requires_grad
        assert torch.autograd.gradcheck(f, ps, eps=1e-6, atol=1e-8, rtol=1e-6)
        worst = fd_worst(lambda: f(*ps), ps)
        print("  <alpha_hat, R> (%s oracle): max relative error %.2e over W_gate, c_gate"
              % ("with" if oracle is not None else "no", worst))
        assert worst <= 1e-6


# ---- against the reference layer's PyTorch code


def reference_from(m):
    """bench/torch_dea.py's DualExpertLayer holding m's parameters."""
    dtype = m.W_rel.dtype
    ref = torch_dea.DualExpertLayer(D, H).to(dtype)
    with torch.no_grad():
        for i, p in enumerate(("W_q", "W_k", "W_v", "W_o")):
            ref.proj[i].weight.copy_(getattr(m, p).weight)
            ref.proj[i].bias.copy_(getattr(m, p).bias)
        ref.w_rel.copy_(m.W_rel)
        ref.w_gate.copy_(m.W_gate)
        ref.c_gate.copy_(m.c_gate)
    return ref, {"W_q.weight": ref.proj[0].weight, "W_q.bias": ref.proj[0].bias, "W_k.weight": ref.proj[1].weight,
                 "W_k.bias": ref.proj[1].bias, "W_v.weight": ref.proj[2].weight, "W_v.bias": ref.proj[2].bias,
                 "W_o.weight": ref.proj[3].weight, "W_o.bias": ref.proj[3].bias, "W_rel": ref.w_rel,
                 "W_gate": ref.w_gate, "c_gate": ref.c_gate}


def compare_with_reference(dtype, rtol, atol, gamma=0.5, with_oracle=True, with_alpha_hat=False):
    """Forward and every gradient of task + gate loss (+ <alpha_hat, R2> with_alpha_hat) against the reference."""
    m = module(dtype)
    ref, ref_params = reference_from(m)
    x, a, km = inputs(dtype, b=3, t=7, seed=9)
    a = a if with_oracle else None
    R = torch.randn(x.shape, dtype=dtype, generator=torch.Generator().manual_seed(4))
    R2 = torch.randn(3, H, 7, 7, dtype=dtype, generator=torch.Generator().manual_seed(8)) if with_alpha_hat else None
    x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    r = m(x1, km, a, gamma_mix=gamma)
    out, ahat, lg = ref(x2, key_mask=km, oracle=a, gamma=gamma)
    ((r["output"] * R).sum() + r["loss_gate"] + ((r["alpha_hat"] * R2).sum() if with_alpha_hat else 0)).backward()
    ((out * R).sum() + lg + ((ahat * R2).sum() if with_alpha_hat else 0)).backward()
    worst = {}

    def close(name, got, want):
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol, equal_nan=True, msg=lambda s: name + ": " + s)
        worst[name] = float((got - want).abs().max())

    close("output", r["output"], out.detach())
    close("alpha_hat", r["alpha_hat"], ahat.detach())
    close("loss_gate", r["loss_gate"].detach(), lg.detach())
    close("grad x", x1.grad, x2.grad)
    for name, p in m.named_parameters():
        if p.grad is None:  # no oracle: the gate gets no gradient at all (the reference's: exactly zero)
            assert not with_oracle and not with_alpha_hat and name in GATE and not ref_params[name].grad.any(), name
            continue
        close("grad " + name, p.grad, ref_params[name].grad)
    if with_oracle:
        # the oracle as the layer used it: clamped to [0, 0.95] per head, NaN where unlabelled or padded
        a_ref = a.clamp(0, 0.95).unsqueeze(1).expand(-1, H, -1, -1).clone()
        a_ref[~km.view(3, 1, 1, 7).expand_as(a_ref)] = float("nan")
        close("alpha_oracle", r["alpha_oracle"], a_ref)
        assert set(r["stats"]) == {"loss_reg", "loss_spot", "loss_decision", "decision_side_acc", "n_decision_pairs"}
    else:
        assert r["alpha_oracle"] is None and r["stats"] == {}
    print("  %s, %s%s: max |difference| %.1e (%s), every gradient compared" % (
        dtype, "gamma_mix %g" % gamma if with_oracle else "no oracle", " + <alpha_hat, R>" if with_alpha_hat else "",
        max(worst.values()), max(worst, key=worst.get)))


def test_assert_close_with_the_reference_layer_double():
    compare_with_reference(torch.float64, rtol=1e-10, atol=1e-12)
    compare_with_reference(torch.float64, rtol=1e-10, atol=1e-12, with_oracle=False)
    compare_with_reference(torch.float64, rtol=1e-10, atol=1e-12, gamma=0.0)
    compare_with_reference(torch.float64, rtol=1e-10, atol=1e-12, with_alpha_hat=True)
    compare_with_reference(torch.float64, rtol=1e-10, atol=1e-12, with_oracle=False, with_alpha_hat=True)


def test_alpha_hat_gradient_at_the_cap_and_the_clip():
    """Across the kinks: head 0's c_gate puts part of its alpha_hat on the 0.95 cap, head 1's part of its logits below
    the -10 clip; those cells pass no gradient, the others do, as in the reference's graph."""
    m = module()
    with torch.no_grad():
        m.c_gate.copy_(torch.tensor([3.0, -10.0], dtype=torch.float64))
    ref, ref_params = reference_from(m)
    x, a, km = inputs(b=3, t=7, seed=9)
    R = torch.randn(3, H, 7, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    r = m(x, km, a, gamma_mix=0.5)
    _, ahat, _ = ref(x, key_mask=km, oracle=a, gamma=0.5)
    capped, clipped = int((ahat[:, 0] >= 0.95).sum()), int((ahat[:, 1] <= torch.sigmoid(torch.tensor(-10.0))).sum())
    assert capped > 0 and clipped > 0 and (ahat[:, 0] < 0.95).any() and (ahat[:, 1] > 1e-4).any()
    (r["alpha_hat"] * R).sum().backward()
    (ahat * R).sum().backward()
    for n in GATE:
        torch.testing.assert_close(dict(m.named_parameters())[n].grad, ref_params[n].grad, rtol=1e-10, atol=1e-12)
    print("  %d capped and %d clipped cells of %d: the gate's gradients agree with the reference" % (
        capped, clipped, ahat.numel()))


def test_assert_close_with_the_reference_layer_float():
    compare_with_reference(torch.float32, rtol=1e-4, atol=1e-5)
    compare_with_reference(torch.float32, rtol=1e-4, atol=1e-5, with_alpha_hat=True)


def test_golden_cases_through_load_state_dict():
    """The reference's own numbers: each golden layer case's parameters (a reference state_dict) loaded with
    load_state_dict, its inputs, the objective sum(output * grad_output) + loss_gate."""
    cases = sorted(glob.glob(os.path.join(harness.DATA, "golden", "layer_*.safetensors")))
    assert len(cases) >= 3
    for path in cases:
        t, meta = harness.load_safetensors(path)
        d, h = int(meta["d_model"]), int(meta["n_heads"])
        for dtype, tol in ((torch.float64, 1e-9), (torch.float32, 1e-4)):
            m = dea.torch.DualExpertAttention(d, h, dropout=0.0, dtype=dtype, bias="W_q.bias" in t,
                                              out_proj="W_o.weight" in t)
            state = {k: torch.from_numpy(v) for k, v in t.items() if not k.startswith(("in.", "out.", "grad."))}
            m.load_state_dict(state, strict=True)
            x = torch.from_numpy(t["in.x"]).to(dtype).requires_grad_(True)
            get = lambda k, conv=(lambda v: torch.from_numpy(v)): conv(t[k]) if k in t else None  # noqa: E731
            a = get("in.alpha_oracle")
            r = m(x, get("in.key_mask"), None if a is None else a.to(dtype), get("in.target_idx"),
                  float(meta.get("gamma_mix", 0)))
            ((r["output"] * torch.from_numpy(t["in.grad_output"]).to(dtype)).sum() + r["loss_gate"]).backward()
            got = {"out.output": r["output"], "out.alpha_hat": r["alpha_hat"], "out.loss_gate": r["loss_gate"],
                   "grad.in.x": x.grad}
            got.update({"grad." + n: p.grad if p.grad is not None else torch.zeros_like(p)
                        for n, p in m.named_parameters()})
            worst = 0.0
            for k, v in got.items():
                if k not in t:
                    continue
                want = torch.from_numpy(t[k]).double()
                err = float((v.detach().double() - want).abs().max()) / max(float(want.abs().max()), 1e-12)
                assert err <= tol, (path, dtype, k, err)
                worst = max(worst, err)
            assert sum(k in t for k in got) >= 14, sorted(got)
            print("  %-30s %s: worst relative error %.1e" % (os.path.basename(path), dtype, worst))


def test_reference_checkpoint_attention_weights_load():
    """A whole reference TransformerModel state_dict (model_cls): each layer's attention weights load strictly."""
    t, _ = harness.load_safetensors(os.path.join(harness.DATA, "golden", "model_cls.safetensors"))
    for layer in ("layers.0.attn.", "layers.1.attn."):
        state = {k[len(layer):]: torch.from_numpy(v) for k, v in t.items() if k.startswith(layer)}
        m = dea.torch.DualExpertAttention(32, 4, dropout=0.0, dtype=torch.float64)
        m.load_state_dict(state, strict=True)
        assert torch.equal(m.W_gate, state["W_gate"])
        assert sorted(m.state_dict()) == sorted(state)


# ---- contracts


def test_gradient_isolation():
    m = module()
    x, a, km = inputs()
    x.requires_grad_(True)
    r = m(x, km, a, gamma_mix=0.5)
    (r["output"] ** 2).mean().backward()  # the task loss alone
    g = {n: p.grad for n, p in m.named_parameters()}
    assert all(g[n] is None for n in GATE), "the task loss wrote a gate gradient"
    assert all(g[n] is not None and g[n].any() for n in MAIN) and x.grad is not None
    task = {n: g[n].clone() for n in MAIN}
    m.zero_grad(set_to_none=True)
    x.grad = None
    r = m(x, km, a, gamma_mix=0.5)
    r["loss_gate"].backward()  # the gate loss alone
    g = {n: p.grad for n, p in m.named_parameters()}
    assert all(g[n] is None for n in MAIN) and x.grad is None, "the gate loss wrote a main gradient"
    assert all(g[n] is not None and g[n].any() for n in GATE)
    gate = {n: g[n].clone() for n in GATE}
    # one backward of the sum gives the same two disjoint sets, to the bit
    m.zero_grad(set_to_none=True)
    r = m(x, km, a, gamma_mix=0.5)
    ((r["output"] ** 2).mean() + r["loss_gate"]).backward()
    both = dict(task, **gate)
    assert all(torch.equal(p.grad, both[n]) for n, p in m.named_parameters())
    # a loss read from alpha_hat alone: the gate's parameters only, as the reference's graph (q, k, E~ detached)
    m.zero_grad(set_to_none=True)
    x.grad = None
    r = m(x, km, a, gamma_mix=0.5)
    assert r["alpha_hat"].requires_grad
    (r["alpha_hat"] ** 2).sum().backward()
    g = {n: p.grad for n, p in m.named_parameters()}
    assert all(g[n] is None for n in MAIN) and x.grad is None, "alpha_hat wrote a main gradient"
    assert all(g[n] is not None and g[n].any() for n in GATE)


def test_alpha_hat_gradient_with_the_tiled_kernel():
    """The tiled kernel keeps no [B, H, T, T] map: alpha_hat's backward recomputes the gate's inputs from the row
    statistics, and gives the reference kernel's gradients (task + gate + <alpha_hat, R>, across the kinks too)."""
    x, a, km = inputs(b=3, t=7, seed=2)
    R = torch.randn(3, H, 7, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    for c_gate in (None, (3.0, -10.0)):
        got = {}
        for kernel in ("reference", "tiled"):
            m = module(kernel=kernel)
            if c_gate is not None:
                with torch.no_grad():
                    m.c_gate.copy_(torch.tensor(c_gate, dtype=torch.float64))
            xr = x.clone().requires_grad_(True)
            r = m(xr, km, a, gamma_mix=0.5)
            ((r["output"] * 0.3).sum() + r["loss_gate"] + (r["alpha_hat"] * R).sum()).backward()
            got[kernel] = [r["alpha_hat"], xr.grad] + [p.grad for p in m.parameters()]
        for p, q in zip(got["reference"], got["tiled"]):
            torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-13)


def test_same_bits_on_one_and_two_threads():
    def run(threads, dtype):
        dea.set_num_threads(threads)
        m = dea.torch.DualExpertAttention(32, 4, dropout=0.0, dtype=dtype, seed=3)
        g = torch.Generator().manual_seed(1)
        x = torch.randn(3, 16, 32, dtype=dtype, generator=g).requires_grad_(True)
        a = torch.rand(3, 16, 16, dtype=dtype, generator=g)
        r = m(x, None, a, gamma_mix=0.5)
        ((r["output"] * 0.5).sum() + r["loss_gate"]).backward()
        return [r["output"], r["alpha_hat"], r["loss_gate"], x.grad] + [p.grad for p in m.parameters()]

    saved = dea.num_threads()
    try:
        for dtype in (torch.float32, torch.float64):
            one, two = run(1, dtype), run(2, dtype)
            assert all(torch.equal(p, q) for p, q in zip(one, two)), dtype
    finally:
        dea.set_num_threads(saved)


def test_alpha_hat_gradient_same_bits_on_one_and_two_threads():
    """alpha_hat's backward runs one head per thread: the same bits for 1 and 2 threads, with either kernel."""
    def run(threads, kernel):
        dea.set_num_threads(threads)
        m = dea.torch.DualExpertAttention(64, 4, dropout=0.0, dtype=torch.float64, seed=3, kernel=kernel)
        g = torch.Generator().manual_seed(1)
        x = torch.randn(4, 64, 64, dtype=torch.float64, generator=g)
        R = torch.randn(4, 4, 64, 64, dtype=torch.float64, generator=g)
        (m(x)["alpha_hat"] * R).sum().backward()
        return [m.W_gate.grad, m.c_gate.grad]

    saved = dea.num_threads()
    try:
        for kernel in ("reference", "tiled"):
            one, two = run(1, kernel), run(2, kernel)
            assert one[0].any() and all(torch.equal(p, q) for p, q in zip(one, two)), kernel
    finally:
        dea.set_num_threads(saved)


def test_argument_errors():
    m = module()
    x, a, km = inputs()
    raises(TypeError, ["x:", "torch.float64", "torch.float32"], m, x.float())
    raises(TypeError, ["x:", "torch.Tensor"], m, x.numpy())
    raises(ValueError, ["x:", "[B, T, 8]"], m, torch.zeros(2, 4, 6, dtype=torch.float64))
    raises(ValueError, ["key_mask:", "[2, 4]"], m, x, km[:, :3])
    raises(ValueError, ["alpha_oracle:"], m, x, km, a[:, :3])
    raises(ValueError, ["target_idx:"], m, x, km, a, torch.full((B, T), 9))
    raises(ValueError, ["gamma_mix:"], m, x, km, a, None, 2.0)
    raises(ValueError, ["alpha_max"], dea.torch.DualExpertAttention, 8, 2, alpha_max=0.9)
    raises(ValueError, ["d_model"], dea.torch.DualExpertAttention, 10, 4)
    raises(TypeError, ["dtype:"], dea.torch.DualExpertAttention, 8, 2, dtype=torch.float16)


def test_parameters_share_the_layer_storage():
    m = module()
    layer = m._layers[torch.float64]
    views = layer.parameters()
    assert all(p.data_ptr() == views[n].ctypes.data for n, p in m.named_parameters()), "a parameter was copied"
    x, a, km = inputs()
    # an optimiser step writes the parameters in place: the layer computes with the new values, no copy needed
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    r = m(x, km, a, gamma_mix=0.5)
    ((r["output"] ** 2).mean() + r["loss_gate"]).backward()
    opt.step()
    assert all(p.data_ptr() == views[n].ctypes.data for n, p in m.named_parameters())
    fresh = dea.torch.DualExpertAttention(D, H, dropout=0.0, dtype=torch.float64)
    fresh.load_state_dict(m.state_dict())
    assert torch.equal(fresh(x, km, a, gamma_mix=0.5)["output"], m(x, km, a, gamma_mix=0.5)["output"])
    # a change of dtype: the values move into the layer of the new dtype, and the parameters onto its storage
    want = m(x, km, a, gamma_mix=0.5)["output"]
    m.float()
    got = m(x.float(), km, a.float(), gamma_mix=0.5)["output"]
    views32 = m._layers[torch.float32].parameters()
    assert all(p.dtype == torch.float32 and p.data_ptr() == views32[n].ctypes.data for n, p in m.named_parameters())
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)
    # copies are independent modules that compute the same
    m.double()
    c = copy.deepcopy(m)
    assert torch.equal(c(x, km, a)["output"], m(x, km, a)["output"])
    with torch.no_grad():
        c.W_o.bias.add_(1.0)
    assert not torch.equal(c(x, km, a)["output"], m(x, km, a)["output"])


def test_tiled_kernel_gives_the_reference_kernels_results():
    x, a, km = inputs(b=3, t=7, seed=2)
    got = {}
    for kernel in ("reference", "tiled"):
        m = module(kernel=kernel)
        xr = x.clone().requires_grad_(True)
        r = m(xr, km, a, gamma_mix=0.5)
        ((r["output"] * 0.3).sum() + r["loss_gate"]).backward()
        got[kernel] = [r["output"], r["alpha_hat"], r["alpha_oracle"], r["loss_gate"], xr.grad] + \
            [p.grad for p in m.parameters()]
    for p, q in zip(got["reference"], got["tiled"]):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-13, equal_nan=True)


def test_forward_caches_are_reused_once_their_graph_is_freed():
    m = module()
    x, a, km = inputs()
    pool = m._pools.setdefault(torch.float64, [])
    r1 = m(x.requires_grad_(True), km, a, gamma_mix=0.5)
    r2 = m(x, km, a, gamma_mix=0.5)  # r1's graph is alive: a second cache
    assert len(pool) == 0
    want = r2["output"].detach().clone()
    r2["output"].sum().backward()
    del r2
    assert len(pool) == 1  # r2's graph freed
    r3 = m(x, km, a, gamma_mix=0.5)  # reuses it
    assert len(pool) == 0 and torch.equal(r3["output"], want)
    r1["output"].sum().backward()  # r1's cache was never taken by another forward
    del r1, r3
    assert len(pool) == 2
    with torch.no_grad():
        m(x, km, a)
    assert len(pool) == 2


def test_inference_save_and_load():
    import io
    m = module()
    x, a, km = inputs()
    with torch.no_grad():
        r = m(x, km, a, gamma_mix=0.5)
    assert not r["output"].requires_grad and not r["loss_gate"].requires_grad
    buf = io.BytesIO()
    torch.save(m, buf)
    buf.seek(0)
    m2 = torch.load(buf)
    assert torch.equal(m2(x, km, a, gamma_mix=0.5)["output"], r["output"])
    assert dea.DualExpertAttention(D, H, dtype=torch.float64).dtype == np.float64  # a torch dtype names it too


def test_dropout_in_training_mode():
    torch.manual_seed(0)
    m = dea.torch.DualExpertAttention(D, H, dropout=0.3, dtype=torch.float64)
    x, a, km = inputs()
    m.eval()
    y_eval = m(x, km, a)["output"]
    m.train()
    torch.manual_seed(1)
    y1 = m(x, km, a)["output"]
    torch.manual_seed(1)
    y2 = m(x, km, a)["output"]
    assert not torch.equal(y1, y_eval) and torch.equal(y1, y2)
    m.eval()
    assert torch.equal(m(x, km, a)["output"], y_eval)


if __name__ == "__main__":
    harness.run(dict(globals()))
