"""Contract checks, run before any kernel: every violation raises ValueError
(TypeError for a non-floating dtype -- non-integer for segment_ids -- or a
non-array argument), naming the argument and the expected and actual shapes."""

from __future__ import annotations

import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np

from .backends import BACKENDS

IMPLS = tuple(BACKENDS)
ACTIVATION_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32), jnp.dtype(jnp.float64))
SEGMENT_ID_DTYPES = (jnp.dtype(jnp.int32), jnp.dtype(jnp.int64))
MIN_CHUNK, MAX_CHUNK = 16, 128


def _fmt(shape):
    return "[" + ", ".join(str(s) for s in shape) + "]"


def _check_typed_array(name, x, kind, kind_words, supported, supported_words):
    """x must be an array (TypeError), of dtype kind `kind` (TypeError) and
    one of `supported` (ValueError); the messages name the argument."""
    if not (hasattr(x, "shape") and hasattr(x, "dtype")):
        raise TypeError(f"{name} must be an array, got {type(x).__name__}")
    if not jnp.issubdtype(x.dtype, kind):
        raise TypeError(f"{name} must have {kind_words}, got {x.dtype}")
    if jnp.dtype(x.dtype) not in supported:
        raise ValueError(f"{name} has dtype {x.dtype}; supported: {supported_words}")


def _check_array(name, x):
    """A floating activation or parameter: float32, bfloat16 (float64 for the oracle)."""
    _check_typed_array(name, x, jnp.floating, "a floating dtype (float32 or bfloat16)",
                       ACTIVATION_DTYPES, "float32, bfloat16 (float64 for the oracle)")


def _check_shape(name, x, expected, meaning):
    if tuple(x.shape) != tuple(expected):
        raise ValueError(f"{name}: expected shape {_fmt(expected)} ({meaning}), "
                         f"got {_fmt(x.shape)}")


def _check_rank(name, x, rank, meaning):
    if x.ndim != rank:
        raise ValueError(f"{name}: expected a rank-{rank} array {meaning}, "
                         f"got shape {_fmt(x.shape)}")


def _check_positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _check_same_dtype(names_arrays):
    dtypes = {jnp.dtype(a.dtype) for _, a in names_arrays}
    if len(dtypes) > 1:
        listed = ", ".join(f"{n}={a.dtype}" for n, a in names_arrays)
        raise ValueError(f"activations must share one dtype, got {listed}")


def _check_param_dtype(name, x, act_dtype):
    allowed = {jnp.dtype(jnp.float32), jnp.dtype(act_dtype)}
    if jnp.dtype(x.dtype) not in allowed:
        raise ValueError(f"{name} has dtype {x.dtype}; expected float32 or the "
                         f"activation dtype {act_dtype}")


def check_chunk_size(chunk_size):
    if (isinstance(chunk_size, bool) or not isinstance(chunk_size, numbers.Integral)
            or not MIN_CHUNK <= chunk_size <= MAX_CHUNK
            or chunk_size & (chunk_size - 1)):
        raise ValueError(f"chunk_size must be a power of two in {MIN_CHUNK}..{MAX_CHUNK}, "
                         f"got {chunk_size!r}")


def check_impl(impl):
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")


def check_scale(scale):
    if scale is None:
        return
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale):
        raise ValueError(f"scale must be None or a finite float, got {scale!r}")


def check_eps(eps):
    if (isinstance(eps, bool) or not isinstance(eps, numbers.Real)
            or not math.isfinite(eps) or eps <= 0):
        raise ValueError(f"eps must be a finite float > 0, got {eps!r}")


def _check_nonpositive_if_concrete(name, x):
    """g <= 0 by the contract; checked when the values are concrete."""
    if isinstance(x, jax.core.Tracer):
        return
    values = np.asarray(jax.device_get(x)).astype(np.float32)   # host-side: never traced
    if bool(np.any(values > 0)):
        raise ValueError(f"{name} must be <= 0 (a log decay), got a positive value")


def check_segment_ids(segment_ids, b, t):
    """None, or [B, T] int32/int64 with values >= 0 (docs/contract.md section
    6); the values are checked when concrete (not under a trace)."""
    if segment_ids is None:
        return
    _check_typed_array("segment_ids", segment_ids, jnp.integer,
                       "an integer dtype (int32 or int64)", SEGMENT_ID_DTYPES, "int32, int64")
    _check_shape("segment_ids", segment_ids, (b, t), "[B, T]")
    if isinstance(segment_ids, jax.core.Tracer):
        return
    values = np.asarray(jax.device_get(segment_ids))            # host-side: never traced
    if bool(np.any(values < 0)):
        raise ValueError("segment_ids must be >= 0 (0 marks padding), "
                         "got a negative value")


def validate_gated_delta_rule(q, k, v, g, beta, scale, initial_state, chunk_size, impl,
                              segment_ids=None):
    """All checks of docs/contract.md sections 1, 5 and 6 for gated_delta_rule."""
    check_impl(impl)
    check_chunk_size(chunk_size)
    check_scale(scale)
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        _check_array(name, x)
    _check_rank("q", q, 4, "[B, T, Hk, Dk]")
    b, t, hk, dk = q.shape
    if t < 1:
        raise ValueError(f"q: sequence length T must be >= 1, got shape {_fmt(q.shape)}")
    if min(b, hk, dk) < 1:
        raise ValueError(f"q: every axis of [B, T, Hk, Dk] must be >= 1, got {_fmt(q.shape)}")
    _check_shape("k", k, q.shape, "[B, T, Hk, Dk], like q")
    _check_rank("v", v, 4, "[B, T, Hv, Dv]")
    if tuple(v.shape[:2]) != (b, t) or min(v.shape) < 1:
        raise ValueError(f"v: expected shape [{b}, {t}, Hv, Dv] (B and T of q), "
                         f"got {_fmt(v.shape)}")
    hv, dv = v.shape[2], v.shape[3]
    if hv % hk:
        raise ValueError(f"v: value heads Hv={hv} must be a multiple of key heads "
                         f"Hk={hk} (q shape {_fmt(q.shape)}, v shape {_fmt(v.shape)})")
    _check_shape("g", g, (b, t, hv), "[B, T, Hv]")
    _check_shape("beta", beta, (b, t, hv), "[B, T, Hv]")
    _check_same_dtype((("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)))
    if initial_state is not None:
        _check_array("initial_state", initial_state)
        _check_shape("initial_state", initial_state, (b, hv, dk, dv), "[B, Hv, Dk, Dv]")
        _check_param_dtype("initial_state", initial_state, v.dtype)
    check_segment_ids(segment_ids, b, t)
    _check_nonpositive_if_concrete("g", g)


def _check_gate_param(name, p, b, t, hv):
    """[Hv], [B', Hv] or [B', T', Hv] with B' in {1, B}, T' in {1, T}."""
    _check_array(name, p)
    ok = ((p.ndim == 1 and p.shape == (hv,))
          or (p.ndim == 2 and p.shape[0] in (1, b) and p.shape[1] == hv)
          or (p.ndim == 3 and p.shape[0] in (1, b) and p.shape[1] in (1, t)
              and p.shape[2] == hv))
    if not ok:
        raise ValueError(f"{name}: expected shape [{hv}], [B'={b} or 1, {hv}] or "
                         f"[B'={b} or 1, T'={t} or 1, {hv}], got {_fmt(p.shape)}")


def validate_mixer(x, conv_weight, a, b, a_log, dt_bias, num_k_heads, num_v_heads,
                   head_k_dim, head_v_dim, use_qk_norm, eps, scale, chunk_size, impl,
                   segment_ids=None, state=None, return_state=False):
    """All checks of docs/contract.md sections 2, 5, 6 and 7 for gdn_decoupled_conv1d."""
    check_impl(impl)
    check_chunk_size(chunk_size)
    check_scale(scale)
    check_eps(eps)
    if not isinstance(use_qk_norm, (bool, np.bool_)):
        raise ValueError(f"use_qk_norm must be a bool, got {use_qk_norm!r}")
    for name, value in (("num_k_heads", num_k_heads), ("num_v_heads", num_v_heads),
                        ("head_k_dim", head_k_dim), ("head_v_dim", head_v_dim)):
        _check_positive_int(name, value)
    if num_v_heads % num_k_heads:
        raise ValueError(f"num_v_heads={num_v_heads} must be a multiple of "
                         f"num_k_heads={num_k_heads}")
    for name, arr in (("x", x), ("conv_weight", conv_weight), ("a", a), ("b", b)):
        _check_array(name, arr)
    _check_rank("x", x, 3, "[B, T, C]")
    bsz, t, c = x.shape
    if t < 1:
        raise ValueError(f"x: sequence length T must be >= 1, got shape {_fmt(x.shape)}")
    if bsz < 1:
        raise ValueError(f"x: batch B must be >= 1, got shape {_fmt(x.shape)}")
    channels = 2 * num_k_heads * head_k_dim + num_v_heads * head_v_dim
    if c != channels:
        raise ValueError(f"x: expected shape [{bsz}, {t}, {channels}] "
                         f"(C = 2*Hk*Dk + Hv*Dv = 2*{num_k_heads}*{head_k_dim} + "
                         f"{num_v_heads}*{head_v_dim}), got {_fmt(x.shape)}")
    _check_rank("conv_weight", conv_weight, 2, "[K, C]")
    if conv_weight.shape[1] != channels or conv_weight.shape[0] < 1:
        raise ValueError(f"conv_weight: expected shape [K, {channels}] with K >= 1, "
                         f"got {_fmt(conv_weight.shape)}")
    hv = num_v_heads
    _check_shape("a", a, (bsz, t, hv), "[B, T, Hv]")
    _check_shape("b", b, (bsz, t, hv), "[B, T, Hv]")
    _check_same_dtype((("x", x), ("a", a), ("b", b)))
    _check_param_dtype("conv_weight", conv_weight, x.dtype)
    for name, p in (("a_log", a_log), ("dt_bias", dt_bias)):
        _check_gate_param(name, p, bsz, t, hv)
        _check_param_dtype(name, p, x.dtype)
    check_segment_ids(segment_ids, bsz, t)
    if not isinstance(return_state, (bool, np.bool_)):
        raise ValueError(f"return_state must be a bool, got {return_state!r}")
    check_state(state, x, conv_weight.shape[0], hv, head_k_dim, head_v_dim)


def check_state(state, x, width, hv, dk, dv):
    """state: None or a GDNState (section 7) matching x [B, T, C]."""
    if state is None:
        return
    if not (isinstance(state, tuple) and hasattr(state, "conv")
            and hasattr(state, "recurrent")):
        raise TypeError(f"state must be a gdn_kernels.GDNState or None, "
                        f"got {type(state).__name__}")
    bsz, _, c = x.shape
    _check_array("state.conv", state.conv)
    _check_shape("state.conv", state.conv, (bsz, width - 1, c), "[B, K-1, C]")
    _check_param_dtype("state.conv", state.conv, x.dtype)
    _check_array("state.recurrent", state.recurrent)
    _check_shape("state.recurrent", state.recurrent, (bsz, hv, dk, dv), "[B, Hv, Dk, Dv]")
    _check_param_dtype("state.recurrent", state.recurrent, x.dtype)
