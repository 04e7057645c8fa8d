"""dea: Dual-Expert Attention (and the dot-product, Laplacian and token-routed attention) of the C++ library dea,
over numpy arrays. ``dea.torch`` wraps DualExpertAttention as a PyTorch module.

Every layer class is made for one dtype, float32 (the default) or float64; its arrays must have that dtype and be
C-contiguous (nothing is converted: a wrong dtype is a TypeError, a wrong shape or layout a ValueError, naming the
argument). See docs/python.md for the whole interface.

    import numpy as np, dea
    layer = dea.DualExpertAttention(64, 4, dtype="float64", seed=1)
    x = np.random.default_rng(0).standard_normal((2, 8, 64))
    r = layer.forward(x, alpha_oracle=oracle, gamma_mix=0.5)   # dict: output, alpha_hat, alpha_oracle, loss_gate, stats
    dx = layer.backward(dy)                                    # task path: never touches W_gate / c_gate
    layer.backward_gate()                                      # gate loss: only W_gate / c_gate
    layer.gradients()["W_rel"]
"""
import numpy as _np

from . import _core
from ._core import set_num_threads, num_threads, run_golden_case  # noqa: F401

__version__ = _core.__version__

__all__ = ["DualExpertAttention", "DotProductAttention", "LaplacianAttention", "TokenRoutedAttention",
           "set_num_threads", "num_threads", "run_golden_case", "__version__"]


def _suffix(dtype):
    """'F32' or 'F64' for float32 or float64 given as a numpy dtype, a type, a name or a torch dtype."""
    d = None
    if dtype is not None:
        try:
            d = _np.dtype(dtype)
        except TypeError:  # a torch dtype: torch.float32 -> "float32"
            try:
                d = _np.dtype(str(dtype).replace("torch.", ""))
            except TypeError:
                d = None
    if d == _np.float32:
        return "F32"
    if d == _np.float64:
        return "F64"
    raise TypeError("dtype: expected float32 or float64, got %r" % (dtype,))


def DualExpertAttention(d_model, n_heads, *, dtype="float32", **options):
    """A Dual-Expert Attention layer of d_model features and n_heads heads, in float32 or float64.

    Options (keyword): seed (initial parameters, default 0), dropout (0), bias (True), out_proj (True),
    lambda_s, tau_s, tau_d, lambda_d (the gate loss; the reference's defaults), kernel ("reference" keeps every map;
    "tiled" keeps row statistics only), block_q, rope_theta (0 = none)."""
    return getattr(_core, "DualExpertAttention" + _suffix(dtype))(d_model, n_heads, **options)


def DotProductAttention(d_model, n_heads, *, dtype="float32", **options):
    """Multi-head scaled dot-product self-attention. Options: seed, dropout, bias."""
    return getattr(_core, "DotProductAttention" + _suffix(dtype))(d_model, n_heads, **options)


def LaplacianAttention(d_model, n_heads, *, dtype="float32", **options):
    """First-Spike Laplacian self-attention. Options: seed, dropout, bias, sigma0."""
    return getattr(_core, "LaplacianAttention" + _suffix(dtype))(d_model, n_heads, **options)


def TokenRoutedAttention(d_model, n_heads, *, dtype="float32", **options):
    """Token-routed multi-head attention (tr_mha, tr_mha_v2). Options: the reference's config fields (variant,
    num_experts, adapter_rank, top_k, ...; docs/token_routed.md) and seed."""
    return getattr(_core, "TokenRoutedAttention" + _suffix(dtype))(d_model, n_heads, **options)
