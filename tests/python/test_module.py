"""The Python module dea over numpy arrays: golden cases, finite-difference gradients of every class (double, a
random projection objective), gradient isolation and accumulation, the same bits on 1 and 2 threads, argument
errors that name the argument, what crosses without a copy, and the GIL released during the work."""
import glob
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import raises  # noqa: E402

np = harness.skip_unless("numpy")
import dea  # noqa: E402

RNG = np.random.default_rng(20261205)
B, T, D, H = 2, 5, 8, 2


def oracle(b=B, t=T, labelled=0.7, rng=RNG):
    """An oracle [b, t, t] in [0, 1] with about (1 - labelled) of the cells unlabelled (NaN)."""
    a = rng.uniform(0.0, 1.0, (b, t, t))
    a[rng.uniform(size=a.shape) > labelled] = np.nan
    return a


def key_mask(b=B, t=T):
    m = np.ones((b, t), dtype=bool)
    m[-1, -2:] = False
    return m


def fd_errors(value, tensors, analytic, eps=1e-6, max_entries=40):
    """max over the entries of each tensor (all, or max_entries of them at random) of |central difference of value()
    - analytic| / max |analytic|; the tensors are perturbed in place (views of the layer, or inputs)."""
    worst = {}
    for name, a in tensors.items():
        g = analytic[name]
        flat = a.reshape(-1)
        assert flat.base is a or flat is a or np.shares_memory(flat, a), name
        idx = np.arange(flat.size)
        if flat.size > max_entries:
            idx = RNG.choice(flat.size, max_entries, replace=False)
        # relative to the tensor's largest gradient; a gradient that is zero up to round-off (a key bias under the
        # softmax) is checked absolutely
        scale = float(np.abs(g).max())
        scale = scale if scale > 1e-8 else 1.0
        err = 0.0
        for k in idx:
            old = flat[k]
            flat[k] = old + eps
            fp = value()
            flat[k] = old - eps
            fm = value()
            flat[k] = old
            err = max(err, abs((fp - fm) / (2 * eps) - g.reshape(-1)[k]) / scale)
        worst[name] = err
    return worst


def assert_small(worst, tol, what):
    bad = {k: v for k, v in worst.items() if not v <= tol}
    print("  %s: max relative error %.2e (%s)" % (what, max(worst.values()), max(worst, key=worst.get)))
    assert not bad, "%s: relative errors above %g: %s" % (what, tol, bad)


# ---- golden cases


def test_golden_cases_double_and_float():
    cases = sorted(glob.glob(os.path.join(harness.DATA, "golden", "layer_*.safetensors")))
    cases += [os.path.join(harness.DATA, "golden", "model_cls.safetensors")]
    cases += sorted(glob.glob(os.path.join(harness.DATA, "golden", "tr_mha", "*.safetensors")))
    assert len(cases) >= 8, cases
    for path in cases:
        pe = os.path.join(harness.DATA, "reference", "model_cls_pe.safetensors") if "model_cls" in path else None
        worst = {}
        for dtype in ("float64", "float32"):
            r = dea.run_golden_case(path, dtype, pe=pe)
            assert r["ok"], (path, dtype, [t for t in r["tensors"] if not t["ok"]])
            assert r["tensors"], path
            worst[dtype] = r["worst"]
        print("  %-32s %-12s worst %.2e (float64), %.2e (float32; %s)" % (
            os.path.basename(path), r["kind"], worst["float64"], worst["float32"], r["tolerance"]))
    raises(Exception, ["nowhere.safetensors"], dea.run_golden_case, "nowhere.safetensors")
    raises(ValueError, ["dtype"], dea.run_golden_case, cases[0], "float16")


# ---- gradients (finite differences in double)


def dea_layer(**kw):
    return dea.DualExpertAttention(D, H, dtype="float64", seed=7, **kw)


def test_dual_expert_task_gradients_match_finite_differences():
    """<y, R> with the alpha-hat of the scores frozen (the reference's graph reads it as a constant): d/dx and d/d
    every main parameter against the task backward."""
    layer = dea_layer()
    x = RNG.standard_normal((B, T, D))
    a = oracle()
    km = key_mask()
    R = RNG.standard_normal((B, T, D))
    frozen = layer.forward(x, km, a, gamma_mix=0.5)["alpha_hat"]

    def value():
        return float(np.sum(layer.forward(x, km, a, gamma_mix=0.5, frozen_alpha_hat=frozen)["output"] * R))

    value()
    layer.zero_grad()
    dx = layer.backward(R)
    grads = {k: v.copy() for k, v in layer.gradients().items()}
    groups = layer.parameter_groups()
    params = {k: v for k, v in layer.parameters().items() if groups[k] == "main"}
    assert set(params) == {"W_q.weight", "W_q.bias", "W_k.weight", "W_k.bias", "W_v.weight", "W_v.bias",
                           "W_o.weight", "W_o.bias", "W_rel"}
    assert_small(fd_errors(value, dict(params, x=x), dict(grads, x=dx)), 1e-6, "DualExpertAttention task")
    assert not grads["W_gate"].any() and not grads["c_gate"].any()


def test_dual_expert_gate_gradients_match_finite_differences():
    layer = dea_layer()
    x = RNG.standard_normal((B, T, D))
    a, km = oracle(), key_mask()
    t = np.full((B, T), -1, dtype=np.int64)
    t[0, :3] = [1, 2, 0]

    def value():
        return layer.forward(x, km, a, t, gamma_mix=0.3)["loss_gate"]

    value()
    layer.zero_grad()
    layer.backward_gate(0.7)
    grads = {k: v / 0.7 for k, v in layer.gradients().items()}
    params = {k: v for k, v in layer.parameters().items() if k in ("W_gate", "c_gate")}
    assert_small(fd_errors(value, params, grads), 1e-6, "DualExpertAttention gate loss")
    assert all(not grads[k].any() for k in grads if k not in params)


def plain_check(layer, what, **fw):
    x = RNG.standard_normal((B, T, D))
    R = RNG.standard_normal((B, T, D))

    def value():
        return float(np.sum(layer.forward(x, **fw) * R))

    value()
    layer.zero_grad()
    dx = layer.backward(R)
    grads = {k: v.copy() for k, v in layer.gradients().items()}
    assert_small(fd_errors(value, dict(layer.parameters(), x=x), dict(grads, x=dx)), 1e-6, what)


def test_dot_product_gradients():
    plain_check(dea.DotProductAttention(D, H, dtype="float64", seed=3), "DotProductAttention", key_mask=key_mask())


def test_laplacian_gradients():
    plain_check(dea.LaplacianAttention(D, H, dtype="float64", seed=4), "LaplacianAttention", key_mask=key_mask(),
                causal=True)


def test_token_routed_gradients():
    ids = RNG.integers(0, 50, (B, T)).astype(np.int64)
    for variant in ("v1", "v2"):
        layer = dea.TokenRoutedAttention(D, H, dtype="float64", seed=5, variant=variant, adapter_gate_init=0.3)
        # away from the initial values' special points (zero verifier weights and v2 up maps, unit norm gains)
        for name, p in layer.parameters().items():
            if name.endswith("norm.weight"):
                p[...] = RNG.normal(1.0, 0.1, p.shape)
            elif name == "context_router_weight":
                p[...] = RNG.normal(0.0, 0.5, p.shape)
            elif "adapter" in name and name != "adapter_output_gate":
                p[...] = RNG.normal(0.0, 0.1, p.shape)
            elif name == "verifier_gate_weight":
                p[...] = RNG.normal(0.0, 0.1, p.shape)
            elif name == "verifier_gate_bias":
                p[...] = 1.0
            elif name == "adapter_output_gate":
                p[...] = 0.5
        plain_check(layer, "TokenRoutedAttention " + variant, token_ids=ids)
        tel = layer.telemetry()
        assert "tr_mha_gate" in tel and "tr_mha_route_0" in tel, tel


# ---- contracts


def test_isolation_and_accumulation():
    layer = dea_layer()
    x = RNG.standard_normal((B, T, D))
    a, km = oracle(), key_mask()
    r = layer.forward(x, km, a, gamma_mix=0.5)
    assert r["loss_gate"] > 0 and r["stats"]["n_decision_pairs"] > 0
    groups = layer.parameter_groups()
    layer.zero_grad()
    dy = RNG.standard_normal((B, T, D))
    layer.backward(dy)
    g = layer.gradients()
    assert all(not g[k].any() for k in groups if groups[k] == "gate"), "the task backward wrote a gate gradient"
    assert all(g[k].any() for k in groups if groups[k] == "main")
    once = {k: v.copy() for k, v in g.items()}
    layer.backward(dy)  # gradients add up
    assert all(np.allclose(g[k], 2 * once[k], rtol=1e-13, atol=0) for k in g)
    layer.zero_grad()
    layer.backward_gate()
    assert all(not g[k].any() for k in groups if groups[k] == "main"), "the gate backward wrote a main gradient"
    assert all(g[k].any() for k in groups if groups[k] == "gate")
    layer.zero_grad()
    dah = RNG.standard_normal((B, H, T, T))
    layer.backward_alpha_hat(dah)  # a loss read from alpha_hat: the gate only
    assert all(not g[k].any() for k in groups if groups[k] == "main"), "alpha_hat's backward wrote a main gradient"
    assert all(g[k].any() for k in groups if groups[k] == "gate")
    raises(ValueError, ["g_alpha_hat:"], layer.backward_alpha_hat, np.zeros((B, H, T, T + 1)))
    want = {k: v.copy() for k, v in g.items()}
    tiled = dea_layer(kernel="tiled")  # no maps: the gate's inputs recomputed, the same gradients
    tiled.forward(x, km, a, gamma_mix=0.5)
    tiled.zero_grad()
    tiled.backward_alpha_hat(dah)
    assert all(np.allclose(tiled.gradients()[k], want[k], rtol=1e-12, atol=1e-14) for k in want)
    rope = dea_layer(kernel="tiled", rope_theta=10000.0)
    rope.forward(x, km, a, gamma_mix=0.5)
    raises(RuntimeError, ["alpha_hat", "RoPE", "kernel='reference'"], rope.backward_alpha_hat, dah)
    rep = layer.verify_gradient_isolation(x, km, a)
    assert rep["ok"] and rep["task_gate_grad"] == 0 and rep["gate_main_grad"] == 0, rep


def test_same_bits_on_one_and_two_threads():
    def run(threads, dtype):
        dea.set_num_threads(threads)
        assert dea.num_threads() == threads
        rng = np.random.default_rng(1)
        layer = dea.DualExpertAttention(32, 4, dtype=dtype, seed=2)
        x = rng.standard_normal((3, 16, 32)).astype(dtype)
        r = layer.forward(x, key_mask(3, 16), oracle(3, 16, rng=rng).astype(dtype), gamma_mix=0.5)
        dx = layer.backward(np.ones_like(x))
        layer.backward_gate()
        return [r["output"], r["alpha_hat"], np.array(r["loss_gate"]), dx] + \
            [v.copy() for v in layer.gradients().values()]

    saved = dea.num_threads()
    try:
        for dtype in ("float32", "float64"):
            one, two = run(1, dtype), run(2, dtype)
            assert all(a.tobytes() == b.tobytes() for a, b in zip(one, two)), dtype
    finally:
        dea.set_num_threads(saved)
    raises(ValueError, ["n:"], dea.set_num_threads, 0)


def test_argument_errors_name_the_argument():
    layer = dea.DualExpertAttention(D, H)  # float32
    x = np.zeros((B, T, D), np.float32)
    raises(TypeError, ["x:", "float32", "float64"], layer.forward, x.astype(np.float64))
    raises(TypeError, ["x:", "numpy.ndarray", "list"], layer.forward, x.tolist())
    raises(ValueError, ["x:", "[B, T, 8]", "[2, 5, 4]"], layer.forward, np.zeros((B, T, 4), np.float32))
    raises(ValueError, ["x:", "C-contiguous"], layer.forward, np.zeros((T, B, D), np.float32).transpose(1, 0, 2))
    raises(ValueError, ["x:", "C-contiguous"], layer.forward, np.asfortranarray(x))
    raises(ValueError, ["x:", "non-finite"], layer.forward, np.full((B, T, D), np.nan, np.float32))
    raises(ValueError, ["key_mask:", "[2, 5]", "[2, 4]"], layer.forward, x, np.ones((B, 4), bool))
    raises(TypeError, ["key_mask:", "uint8 or bool", "float32"], layer.forward, x, np.ones((B, T), np.float32))
    a = oracle().astype(np.float32)
    raises(TypeError, ["alpha_oracle:", "float32", "float64"], layer.forward, x, None, a.astype(np.float64))
    raises(ValueError, ["alpha_oracle:", "[2, 5, 5] or [2, 2, 5, 5]"], layer.forward, x, None, a[:, :, :4].copy())
    raises(ValueError, ["alpha_oracle:", "inf"], layer.forward, x, None, np.full_like(a, np.inf))
    raises(ValueError, ["target_idx:", "without alpha_oracle"], layer.forward, x, None, None,
           np.zeros((B, T), np.int64))
    raises(TypeError, ["target_idx:", "int64", "int32"], layer.forward, x, None, a, np.zeros((B, T), np.int32))
    raises(ValueError, ["target_idx:", "[0, 5)", "7"], layer.forward, x, None, a, np.full((B, T), 7, np.int64))
    raises(ValueError, ["gamma_mix:"], layer.forward, x, None, a, None, 1.5)
    raises(ValueError, ["dy:", "[2, 5, 8]", "[2, 4, 8]"], lambda: (layer.forward(x), layer.backward(
        np.zeros((B, 4, D), np.float32))))
    raises(ValueError, ["backward", "no forward"], dea.DualExpertAttention(D, H).backward, x)
    raises(TypeError, ["cache:", "new_cache"], layer.forward, x, cache=dea.DotProductAttention(D, H).new_cache())
    raises(TypeError, ["dtype:"], dea.DualExpertAttention, D, H, dtype="float16")
    raises(TypeError, ["dtype:"], dea.DualExpertAttention, D, H, dtype=None)
    for dt in ("float64", np.float64, np.dtype("float64")):
        assert dea.DualExpertAttention(D, H, dtype=dt).dtype == np.float64
    assert dea.DualExpertAttention(D, H, dtype=np.float32).dtype == np.float32
    raises(ValueError, ["kernel:"], dea.DualExpertAttention, D, H, kernel="fast")
    raises(ValueError, ["n_heads"], dea.DualExpertAttention, 10, 3)
    tr = dea.TokenRoutedAttention(D, H)
    raises(ValueError, ["token_ids:", "[2, 5]"], tr.forward, x, np.zeros((B, 4), np.int64))
    raises(ValueError, ["x:", "C-contiguous"], dea.DotProductAttention(D, H).forward, x[:, ::-1])


def test_zero_copy():
    layer = dea.DualExpertAttention(D, H, dtype="float64", seed=1)
    x = RNG.standard_normal((B, T, D))
    r = layer.forward(x)
    # the output owns the library's matrix: not a numpy-allocated copy
    assert not r["output"].flags.owndata and type(r["output"].base).__name__ == "PyCapsule"
    dx = layer.backward(np.ones_like(x))
    assert not dx.flags.owndata and type(dx.base).__name__ == "PyCapsule"
    # parameters and gradients are views of the layer's storage: the same memory at every call, and writing
    # them writes the layer
    p1, p2 = layer.parameters(), layer.parameters()
    assert all(p1[k].ctypes.data == p2[k].ctypes.data and not p1[k].flags.owndata for k in p1)
    assert layer.gradients()["W_rel"].ctypes.data == layer.gradients()["W_rel"].ctypes.data
    assert p1["W_o.weight"].flags.writeable
    p1["W_o.bias"][...] = 0.0
    p1["W_o.weight"][...] = 0.0
    assert not layer.forward(x)["output"].any()
    p1["W_o.bias"][...] = 1.5
    assert np.all(layer.forward(x)["output"] == 1.5)
    # a view keeps the layer alive
    w = dea.DualExpertAttention(D, H, seed=1).parameters()["W_rel"]
    assert np.isfinite(w).all() and w.shape == (H, D // H, D // H)


def test_separate_caches():
    """Two forwards with caches of their own, then their backwards in the other order: the same as one by one."""
    layer = dea_layer()
    x1, x2 = RNG.standard_normal((B, T, D)), RNG.standard_normal((1, 3, D))
    c1, c2 = layer.new_cache(), layer.new_cache()
    layer.forward(x1, cache=c1)
    layer.forward(x2, cache=c2)
    dx2 = layer.backward(np.ones((1, 3, D)), cache=c2)
    dx1 = layer.backward(np.ones((B, T, D)), cache=c1)
    layer.forward(x1)
    assert np.array_equal(layer.backward(np.ones((B, T, D))), dx1)
    layer.forward(x2)
    assert np.array_equal(layer.backward(np.ones((1, 3, D))), dx2)


def test_calls_from_several_threads():
    """Layers used from two Python threads at once (each its own layer, and both one layer with caches of their
    own) give the results of the same calls one after the other."""
    x = [RNG.standard_normal((2, 16, 32)) for _ in range(2)]

    def run(layer, xi, cache=None):
        r = layer.forward(xi, cache=cache)
        return r["output"], layer.backward(np.ones_like(xi), cache=cache)

    layers = [dea.DualExpertAttention(32, 4, dtype="float64", seed=s) for s in (1, 2)]
    want = [run(layers[i], x[i]) for i in range(2)]
    shared = dea.DualExpertAttention(32, 4, dtype="float64", seed=1)
    caches = [shared.new_cache(), shared.new_cache()]
    want_shared = [run(shared, x[i], caches[i]) for i in range(2)]
    got, got_shared = [None, None], [None, None]

    def work(i):
        for _ in range(5):
            got[i] = run(layers[i], x[i])
            got_shared[i] = run(shared, x[i], caches[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(2):
        assert all(np.array_equal(a, b) for a, b in zip(got[i], want[i]))
        assert all(np.array_equal(a, b) for a, b in zip(got_shared[i], want_shared[i]))


def test_gil_is_released():
    """While another thread is inside a long forward, this Python thread keeps running. Holding the GIL, the call
    would let it run at most once or twice per forward (at a bytecode boundary just before the call)."""
    saved = dea.num_threads()
    dea.set_num_threads(1)
    try:
        layer = dea.DualExpertAttention(128, 4, seed=1)
        x = RNG.standard_normal((8, 256, 128)).astype(np.float32)
        reps = 4
        inside = [False]
        done = threading.Event()

        def work():
            for _ in range(reps):
                inside[0] = True
                layer.forward(x)
                inside[0] = False
            done.set()

        th = threading.Thread(target=work)
        seen_inside, t0 = 0, time.perf_counter()
        th.start()
        while not done.is_set():
            seen_inside += inside[0]
            time.sleep(0.001)
        th.join()
        elapsed = time.perf_counter() - t0
        print("  %d forwards in %.0f ms; this thread ran %d times during them" % (reps, elapsed * 1e3, seen_inside))
        assert seen_inside >= 3 * reps, seen_inside
    finally:
        dea.set_num_threads(saved)


if __name__ == "__main__":
    harness.run(dict(globals()))
