"""dea.torch: Dual-Expert Attention as a PyTorch module, computed by the C++ library.

``DualExpertAttention(d_model, n_heads, ...)`` takes the reference layer's constructor options and forward
arguments, has its state_dict names (W_q.weight, W_q.bias, ..., W_o.weight, W_o.bias, W_rel, W_gate, c_gate) and
returns its dictionary (output, alpha_hat, alpha_oracle, loss_gate, stats). The gradients follow the reference's
graph: ``output`` depends on x and every parameter but W_gate / c_gate; ``loss_gate`` and ``alpha_hat`` only on
W_gate and c_gate. So backpropagating the task loss leaves W_gate.grad and c_gate.grad untouched, and
backpropagating loss_gate (or a loss read from alpha_hat) alone leaves every other gradient untouched.

Only torch's Python API is used (tensors cross as numpy arrays without copies), so this works with any torch that
has ``torch.from_numpy``; the C++ module is built without libtorch. CPU tensors, float32 or float64.
"""
import numpy as _np
import torch as _torch

from . import _core, _suffix

__all__ = ["DualExpertAttention", "DualExpertAttentionFunction"]

_ALPHA_MAX, _LOGIT_CLIP = 0.95, 10.0


def _numpy_in(t, dtype, name):
    """A CPU tensor as a numpy array of `dtype` (a torch dtype), copied only when it is not already one."""
    if not isinstance(t, _torch.Tensor):
        raise TypeError("%s: expected a torch.Tensor, got %s" % (name, type(t).__name__))
    if t.device.type != "cpu":
        raise ValueError("%s: expected a CPU tensor, got one on %s" % (name, t.device))
    return t.detach().to(dtype).contiguous().numpy()


class _CacheLease:
    """A dea forward cache lent to one autograd node; back to its pool when the node (its graph) is freed, so the
    next forwards reuse its buffers instead of allocating (and page-faulting) new ones."""

    __slots__ = ("pool", "cache")

    def __init__(self, pool, cache):
        self.pool, self.cache = pool, cache

    def __del__(self):
        self.pool.append(self.cache)


class DualExpertAttentionFunction(_torch.autograd.Function):
    """One Dual-Expert forward of a dea layer as an autograd node.

    apply(layer, info, x, key_mask, alpha_oracle, target_idx, gamma_mix, training, seed, n_gate, *params): `layer` is
    a dea DualExpertAttention of x's dtype whose parameters hold the values of `params` (its parameter order, the gate
    parameters last, `n_gate` of them); `info` is a dict that receives alpha_oracle and stats, and may hold "lease", a
    _CacheLease of the cache to use (else the node makes a cache of its own). Returns output,
    alpha_hat and loss_gate. Backward: the output's gradient reaches x and the main parameters (the library's task
    backward); loss_gate's and alpha_hat's gradients reach only the gate parameters (the gate backward, and the
    gate's chain rule from d/d alpha_hat: the gate reads q, k and the normalised experts as constants)."""

    @staticmethod
    def forward(ctx, layer, info, x, key_mask, alpha_oracle, target_idx, gamma_mix, training, seed, n_gate, *params):
        ctx.set_materialize_grads(False)
        lease = info.pop("lease", None)
        cache = lease.cache if lease is not None else layer.new_cache()
        ctx.lease = lease  # the cache goes back to its pool with this node
        r = layer.forward(x.detach().contiguous().numpy(), key_mask, alpha_oracle, target_idx, gamma_mix,
                          training=training, cache=cache, seed=seed)
        ctx.layer, ctx.cache, ctx.n_gate = layer, cache, n_gate
        ctx.names = list(layer.parameter_groups())
        info["alpha_oracle"] = r["alpha_oracle"]
        info["stats"] = r["stats"]
        out = _torch.from_numpy(r["output"])
        alpha_hat = _torch.from_numpy(r["alpha_hat"])
        return out, alpha_hat, _torch.tensor(r["loss_gate"], dtype=x.dtype)

    @staticmethod
    def backward(ctx, g_out, g_alpha_hat, g_loss):
        layer, cache, names, n_gate = ctx.layer, ctx.cache, ctx.names, ctx.n_gate
        n_main = len(names) - n_gate
        dx, grads = None, [None] * len(names)
        if g_out is not None and any(ctx.needs_input_grad[2:3] + ctx.needs_input_grad[10:10 + n_main]):
            layer.zero_grad()
            dx = _torch.from_numpy(layer.backward(g_out.contiguous().numpy(), cache=cache))
            g = layer.gradients()
            grads[:n_main] = [_torch.from_numpy(g[n].copy()) for n in names[:n_main]]
        g_alpha = g_alpha_hat if g_alpha_hat is not None and bool(g_alpha_hat.any()) else None
        if (g_loss is not None or g_alpha is not None) and any(ctx.needs_input_grad[10 + n_main:]):
            layer.zero_grad()
            if g_loss is not None:
                layer.backward_gate(float(g_loss), cache=cache)
            if g_alpha is not None:  # alpha_hat's graph: the gate's parameters only (it reads q, k, E~ as constants)
                layer.backward_alpha_hat(g_alpha.contiguous().numpy(), cache=cache)
            g = layer.gradients()
            grads[n_main:] = [_torch.from_numpy(g[n].copy()) for n in names[n_main:]]
        layer.zero_grad()
        return (None, None, dx, None, None, None, None, None, None, None, *grads)


class DualExpertAttention(_torch.nn.Module):
    """Dual-Expert Attention with the reference's interface, computed by dea.

    Constructor: d_model=512, n_heads=8, dropout=0.1, bias=True, out_proj=True, lambda_s, tau_s, tau_d, lambda_d (the
    reference's defaults), alpha_max=0.95 and logit_clip=10.0 (these two are fixed in dea: other values are an
    error); and dea's own: dtype (default torch.get_default_dtype()), seed (the initial parameters' draw; default
    one drawn from torch's generator), kernel ("reference" or "tiled").

    forward(x [B, T, D], key_mask [B, T] bool (True = real key), alpha_oracle [B, T, T] or [B, H, T, T] (NaN = no
    label), target_idx [B, T] or [B, H, T] long (-1 = none), gamma_mix) returns dict(output [B, T, D],
    alpha_hat [B, H, T, T], alpha_oracle (the clamped oracle per head, NaN where unlabelled, or None), loss_gate
    (0-d tensor), stats (dict; empty without an oracle)). Dropout on the attention probabilities is active in
    training mode (its mask is drawn by dea from a seed drawn from torch's generator)."""

    def __init__(self, d_model=512, n_heads=8, dropout=0.1, bias=True, out_proj=True, lambda_s=2.0, tau_s=0.1,
                 tau_d=0.1, lambda_d=0.5, alpha_max=_ALPHA_MAX, logit_clip=_LOGIT_CLIP, *, dtype=None, seed=None,
                 kernel="reference"):
        super().__init__()
        if alpha_max != _ALPHA_MAX or logit_clip != _LOGIT_CLIP:
            raise ValueError("alpha_max and logit_clip: dea fixes them at %g and %g, got %r and %r"
                             % (_ALPHA_MAX, _LOGIT_CLIP, alpha_max, logit_clip))
        if d_model % n_heads != 0:
            raise ValueError("d_model: expected a multiple of n_heads = %d, got %d" % (n_heads, d_model))
        dtype = dtype or _torch.get_default_dtype()
        if seed is None:
            seed = int(_torch.randint(0, 2 ** 62, (1,)).item())
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.dropout, self.bias, self.out_proj = float(dropout), bool(bias), bool(out_proj)
        self._options = dict(dropout=float(dropout), bias=bool(bias), out_proj=bool(out_proj), lambda_s=lambda_s,
                             tau_s=tau_s, tau_d=tau_d, lambda_d=lambda_d, kernel=kernel)
        self._seed = seed
        self._layers = {}  # torch dtype -> dea layer (parameters shared with this module's while the dtype holds)
        self._pools = {}   # torch dtype -> forward caches of that layer no graph holds any more
        layer = self._layer(dtype)
        # the reference's names: submodules W_q, W_k, W_v, W_o holding weight and bias (W_o an Identity without
        # out_proj), then W_rel, W_gate, c_gate; each parameter is a tensor over the dea layer's own storage
        for p in ("W_q", "W_k", "W_v") + (("W_o",) if out_proj else ()):
            self.add_module(p, _torch.nn.Module())
        if not out_proj:
            self.W_o = _torch.nn.Identity()
        for name, view in layer.parameters().items():
            self._parameter_owner(name)[0].register_parameter(self._parameter_owner(name)[1],
                                                              _torch.nn.Parameter(_torch.from_numpy(view)))
        self._gate_names = [n for n, g in layer.parameter_groups().items() if g == "gate"]

    def _parameter_owner(self, name):
        """The module and attribute of a state_dict name ("W_q.weight" -> (self.W_q, "weight"))."""
        if "." in name:
            mod, attr = name.split(".")
            return getattr(self, mod), attr
        return self, name

    def _layer(self, dtype):
        if dtype not in (_torch.float32, _torch.float64):
            raise TypeError("dtype: expected torch.float32 or torch.float64, got %s" % (dtype,))
        if dtype not in self._layers:
            self._layers[dtype] = getattr(_core, "DualExpertAttention" + _suffix(dtype))(
                self.d_model, self.n_heads, seed=self._seed, **self._options)
        return self._layers[dtype]

    def _synced_layer(self, dtype):
        """The dea layer of `dtype` holding this module's parameter values: shared storage normally; after a change
        of dtype, device or tensor (module.double(), param.data = ...), the values are copied in once and the
        parameter is pointed at the layer's storage again."""
        layer = self._layer(dtype)
        for name, view in layer.parameters().items():
            p = getattr(*self._parameter_owner(name))
            if p.device.type != "cpu":
                raise ValueError("%s: dea runs on the CPU, the parameter is on %s" % (name, p.device))
            if p.dtype == dtype and p.data_ptr() == view.ctypes.data:
                continue
            if tuple(p.shape) != view.shape:
                raise ValueError("%s: expected shape %s, got %s" % (name, list(view.shape), list(p.shape)))
            view[...] = p.detach().to(dtype).numpy()
            p.data = _torch.from_numpy(view)
        return layer

    def parameter_groups(self):
        """name -> "main" or "gate" (the reference's optimiser groups: names with W_gate or c_gate are "gate")."""
        return {n: ("gate" if n in self._gate_names else "main") for n, _ in self.named_parameters()}

    def forward(self, x, key_mask=None, alpha_oracle=None, target_idx=None, gamma_mix=0.0, *, causal=False):
        dtype = self.W_rel.dtype
        if not isinstance(x, _torch.Tensor):
            raise TypeError("x: expected a torch.Tensor, got %s" % type(x).__name__)
        if x.dtype != dtype:
            raise TypeError("x: expected dtype %s (the module's parameters), got %s" % (dtype, x.dtype))
        if x.device.type != "cpu":
            raise ValueError("x: expected a CPU tensor, got one on %s" % x.device)
        if causal:
            raise ValueError("causal: dea.torch runs bidirectional attention only (use dea.DualExpertAttention)")
        layer = self._synced_layer(dtype)
        km = None if key_mask is None else _numpy_in(key_mask, _torch.bool, "key_mask")
        oracle = None if alpha_oracle is None else _numpy_in(alpha_oracle, dtype, "alpha_oracle")
        targets = None if target_idx is None else _numpy_in(target_idx, _torch.int64, "target_idx")
        training = self.training and self.dropout > 0
        seed = int(_torch.randint(0, 2 ** 62, (1,)).item()) if training else None
        names = list(layer.parameter_groups())
        params = [getattr(*self._parameter_owner(n)) for n in names]
        pool = self._pools.setdefault(dtype, [])
        info = {"lease": _CacheLease(pool, pool.pop() if pool else layer.new_cache())}
        out, alpha_hat, loss_gate = DualExpertAttentionFunction.apply(
            layer, info, x, km, oracle, targets, float(gamma_mix), training, seed, len(self._gate_names), *params)
        a_ref = info["alpha_oracle"]
        if a_ref is not None:
            a_ref = _torch.from_numpy(a_ref)
        elif oracle is not None:  # the tiled kernel keeps no map of it: the same values from the inputs
            a_ref = _torch.from_numpy(oracle).clamp(0.0, _ALPHA_MAX)
            if a_ref.dim() == 3:
                a_ref = a_ref.unsqueeze(1).expand(-1, self.n_heads, -1, -1)
            if km is not None:
                a_ref = a_ref.masked_fill(~_torch.from_numpy(km).view(km.shape[0], 1, 1, -1), float("nan"))
            a_ref = a_ref.contiguous()
        return {"output": out, "alpha_hat": alpha_hat,
                "alpha_oracle": a_ref,
                "loss_gate": loss_gate, "stats": info["stats"]}

    def extra_repr(self):
        return "d_model=%d, n_heads=%d, dropout=%g, bias=%s, out_proj=%s" % (
            self.d_model, self.n_heads, self.dropout, self.bias, self.out_proj)

    # the dea layers are rebuilt from the parameters after copying or unpickling
    def __getstate__(self):
        state = self.__dict__.copy()
        state["_layers"], state["_pools"] = {}, {}
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
