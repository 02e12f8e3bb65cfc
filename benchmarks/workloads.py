"""What is benchmarked: sizes, seeded inputs and the functions per
(op, impl, mode).

ops     delta_rule  gated_delta_rule(q, k, v, g, beta)      -> (o, final_state)
        mixer       gdn_decoupled_conv1d(x, w, a, b, a_log, dt_bias) -> o
impls   reference     public API, impl="reference": token scan, plain jax.grad
        xla           public API, impl="xla": chunked, hand-written custom VJP
        xla-autodiff  gdn_kernels.xla_impl.forward differentiated by plain
                      jax.grad (no custom_vjp): the baseline the VJP must beat.
                      For the mixer: mixer.prologue_of + xla_impl.forward.
        pallas        public API, impl="pallas" (interpret mode on CPU,
                      compiled on TPU; not runnable on GPU)
        plain-chunked benchmarks.plain_chunked: the chunked JAX a user would
                      write first (float32 cumsum decay, WY by a triangular
                      solve, scan), differentiated by plain jax.grad. For the
                      mixer: mixer.prologue_of + that.
modes   fwd           the forward outputs
        fwd+bwd       jax.grad of sum(outputs * fixed random cotangents) with
                      respect to every differentiable input

Every function takes the primal inputs followed by the cotangents (passed as
arguments, not closed over, so no large constants land in the HLO).

Packed overhead (benchmarks/packed.py): build_fn(..., packed=False|True)
gives functions that take one more argument, segment_ids [B, T] int32, after
the cotangents; packed=True passes it to the op, packed=False ignores it and
passes segment_ids=None, so both variants have the same argument list.
packed_segment_ids builds a realistic packing.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable, List, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

import gdn_kernels
from gdn_kernels import mixer as mixer_mod
from gdn_kernels import xla_impl
from gdn_kernels.chunk_math import accumulation_dtype
from gdn_kernels.backends import BACKENDS
from gdn_kernels.l2norm import DEFAULT_EPS
from strategies import shapes

from benchmarks.plain_chunked import chunked_gated_delta_rule

OPS = ("delta_rule", "mixer")
# the public API's impls (gdn_kernels.backends.BACKENDS) and two baselines
BASELINES = ("xla-autodiff", "plain-chunked")
IMPLS = tuple(BACKENDS) + BASELINES
MODES = ("fwd", "fwd+bwd")
CONV_WIDTH = 4


@dataclasses.dataclass(frozen=True)
class Size:
    """One benchmark size: B, T and a head layout (Hk, Hv, Dk, Dv)."""
    B: int
    T: int
    Hk: int
    Hv: int
    Dk: int
    Dv: int

    @classmethod
    def of(cls, layout_name: str, batch: int, t: int) -> "Size":
        """B and T over a named layout of strategies.shapes.LAYOUTS."""
        hl = shapes.layout(layout_name)
        return cls(batch, t, hl.k_heads, hl.v_heads, hl.dk, hl.dv)

    @property
    def label(self) -> str:
        d = f"D{self.Dk}" if self.Dk == self.Dv else f"Dk{self.Dk}-Dv{self.Dv}"
        return f"B{self.B}-T{self.T}-Hk{self.Hk}-Hv{self.Hv}-{d}"

    @property
    def family(self) -> Tuple[int, int, int, int, int]:
        """Everything but T: sizes of one family differ only in T (growth fits)."""
        return (self.B, self.Hk, self.Hv, self.Dk, self.Dv)

    @property
    def family_label(self) -> str:
        return Size(self.B, 0, self.Hk, self.Hv, self.Dk, self.Dv).label.replace("-T0", "")

    @property
    def work(self) -> int:
        """Proportional to the flops of every impl (B T Hv Dk Dv)."""
        return self.B * self.T * self.Hv * self.Dk * self.Dv

    @property
    def channels(self) -> int:
        return 2 * self.Hk * self.Dk + self.Hv * self.Dv

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


# Two families (layouts bench-d64 and bench-d128: Hk=2, Hv=4, D=64 / 128) so
# that growth in T is fitted at fixed B, H, D.
DEFAULT_LADDER = (
    tuple(Size.of("bench-d64", 1, t) for t in (256, 512, 1024))
    + tuple(Size.of("bench-d128", 2, t) for t in (512, 1024, 2048, 4096, 8192)))
QUICK_LADDER = tuple(Size.of("bench-quick", 1, t) for t in (64, 128))
ACCEPTANCE_SIZE = Size.of("bench-d128", 2, 4096)
PACKED_QUICK_SIZE = Size.of("bench-quick", 2, 128)   # --quick --packed: two rows
# Decode (benchmarks/decode.py): one token per call (T=1) at B = 1, 8, 64 over
# Hk=16, Hv=32, Dk=Dv=128; chunked prefill of one B=2, T=4096 row pair split
# into pieces of these lengths (the whole row = one pass).
DECODE_LAYOUT = "bench-decode"
DECODE_BATCHES = (1, 8, 64)
DECODE_SIZES = tuple(Size.of(DECODE_LAYOUT, b, 1) for b in DECODE_BATCHES)
DECODE_QUICK_SIZES = (Size.of("bench-quick", 1, 1), Size.of("bench-quick", 4, 1))
PREFILL_SIZE = ACCEPTANCE_SIZE
PREFILL_PIECES = (4096, 1024, 256)
PREFILL_QUICK_SIZE = Size.of("bench-quick", 2, 128)
PREFILL_QUICK_PIECES = (128, 32, 8)


def parse_size(text: str) -> Size:
    """"LAYOUT,B,T" (a name of strategies.shapes.LAYOUTS) or "B,T,Hk,Hv,D"
    or "B,T,Hk,Hv,Dk,Dv" (separators , x or :)."""
    first, _, rest = text.strip().partition(",")
    if first in shapes.LAYOUTS:
        try:
            batch, t = (int(p) for p in rest.split(","))
        except ValueError:
            batch = t = 0
        if min(batch, t) < 1:
            raise ValueError(f"size {text!r}: expected LAYOUT,B,T (positive ints)")
        return Size.of(first, batch, t)
    parts = [p for p in re.split(r"[,x:]", text.strip()) if p]
    try:
        nums = [int(p) for p in parts]
    except ValueError:
        nums = []
    if len(nums) == 5:
        nums.append(nums[4])
    if len(nums) != 6 or min(nums) < 1 or nums[3] % nums[2]:
        raise ValueError(f"size {text!r}: expected LAYOUT,B,T (layouts: "
                         f"{', '.join(sorted(shapes.LAYOUTS))}) or B,T,Hk,Hv,D or "
                         "B,T,Hk,Hv,Dk,Dv (positive ints, Hv a multiple of Hk)")
    return Size(*nums)


# --------------------------------------------------------------------------
# inputs (numpy, from a seed)
# --------------------------------------------------------------------------

def _l2(x):
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + 1e-6)


def make_inputs(op: str, size: Size, seed: int) -> Tuple[List[np.ndarray], List[np.ndarray]]:
    """(primal inputs, cotangents) as float32 numpy arrays, deterministic in
    (op, size, seed). q, k unit rows, decay exp(g) in (0.9, 0.999)."""
    rng = np.random.default_rng(seed)
    s = size
    if op == "delta_rule":
        q = _l2(rng.standard_normal((s.B, s.T, s.Hk, s.Dk), np.float32))
        k = _l2(rng.standard_normal((s.B, s.T, s.Hk, s.Dk), np.float32))
        v = rng.standard_normal((s.B, s.T, s.Hv, s.Dv), np.float32)
        g = np.log(rng.uniform(0.9, 0.999, (s.B, s.T, s.Hv))).astype(np.float32)
        beta = rng.uniform(0.05, 0.95, (s.B, s.T, s.Hv)).astype(np.float32)
        primals = [q, k, v, g, beta]
        cots = [rng.standard_normal((s.B, s.T, s.Hv, s.Dv), np.float32),
                rng.standard_normal((s.B, s.Hv, s.Dk, s.Dv), np.float32)]
    elif op == "mixer":
        x = rng.standard_normal((s.B, s.T, s.channels), np.float32)
        w = (rng.standard_normal((CONV_WIDTH, s.channels), np.float32) * 0.5)
        a = rng.standard_normal((s.B, s.T, s.Hv), np.float32)
        b = rng.standard_normal((s.B, s.T, s.Hv), np.float32)
        a_log = np.log(rng.uniform(1.0, 16.0, (s.Hv,))).astype(np.float32)
        dt_bias = rng.standard_normal((s.Hv,), np.float32) * 0.5
        primals = [x, w, a, b, a_log, dt_bias]
        cots = [rng.standard_normal((s.B, s.T, s.Hv, s.Dv), np.float32)]
    else:
        raise ValueError(f"unknown op {op!r}")
    return primals, cots


def device_inputs(op: str, size: Size, dtype, seed: int) -> List[jax.Array]:
    """Primals then cotangents on the default device; activations (q, k, v,
    g, beta / x, a, b) in `dtype`, parameters and cotangents float32."""
    primals, cots = make_inputs(op, size, seed)
    act_idx = {"delta_rule": (0, 1, 2, 3, 4), "mixer": (0, 2, 3)}[op]
    out = [jnp.asarray(a, dtype=dtype if i in act_idx else jnp.float32)
           for i, a in enumerate(primals)]
    return out + [jnp.asarray(c) for c in cots]


# --------------------------------------------------------------------------
# packed documents (segment_ids)
# --------------------------------------------------------------------------

def _doc_lengths(rng, total: int, n: int, start: int, chunk: int) -> List[int]:
    """n lengths >= 1 summing to `total`, uneven, with no document boundary
    (absolute position start + cumulative length) on a multiple of `chunk`."""
    n = max(1, min(n, total))
    w = rng.dirichlet(np.full(n, 0.8))
    lengths = np.maximum(1, np.floor(w * total).astype(int))
    lengths[-1] += total - int(lengths.sum())
    while lengths[-1] < 1:                          # floors overshot: take from the longest
        i = int(np.argmax(lengths[:-1]))
        lengths[i] -= 1
        lengths[-1] += 1
    lengths = [int(x) for x in lengths]
    pos = start
    for i in range(n - 1):                          # move a boundary off a chunk edge
        pos += lengths[i]
        if chunk > 1 and pos % chunk == 0 and lengths[i + 1] > 1:
            lengths[i] += 1
            lengths[i + 1] -= 1
            pos += 1
    return lengths


def packed_layout(batch: int, t: int, chunk: int, seed: int) -> List[List[Tuple[int, int]]]:
    """Per row, the runs (id, length) of a realistic packing, deterministic in
    (batch, t, chunk, seed): several documents of uneven lengths (ids 1, 2, ...),
    boundaries off chunk edges, right padding (id 0) of 2-6 % of T on every
    row, and on row 0 one interior padding run (~1 % of T) between two
    documents. About T/700 documents per row (at least 2)."""
    rng = np.random.default_rng(seed + 7919)
    rows = []
    n_docs = max(2, round(t / 700))
    for b in range(batch):
        right = max(1, round(t * rng.uniform(0.02, 0.06)))
        interior = max(1, round(t * 0.01)) if b == 0 and t >= 16 else 0
        body = t - right - interior
        n = n_docs + (b % 2)                        # rows differ in count, too
        if interior:
            n1 = max(1, n // 2)
            first = int(round(body * rng.uniform(0.35, 0.6)))
            first = min(max(first, n1), body - (n - n1))
            parts = [(_doc_lengths(rng, first, n1, 0, chunk), 0),
                     (_doc_lengths(rng, body - first, n - n1, first + interior, chunk),
                      interior)]
        else:
            parts = [(_doc_lengths(rng, body, n, 0, chunk), 0)]
        runs, doc_id = [], 0
        for lengths, pad_before in parts:
            if pad_before:
                runs.append((0, pad_before))
            for length in lengths:
                doc_id += 1
                runs.append((doc_id, length))
        runs.append((0, right))
        assert sum(n for _, n in runs) == t
        rows.append(runs)
    return rows


def packed_segment_ids(batch: int, t: int, chunk: int, seed: int) -> np.ndarray:
    """segment_ids [B, T] int32 of packed_layout."""
    ids = np.zeros((batch, t), np.int32)
    for b, runs in enumerate(packed_layout(batch, t, chunk, seed)):
        ids[b] = np.concatenate([np.full(n, i, np.int32) for i, n in runs])
    return ids


# --------------------------------------------------------------------------
# the functions
# --------------------------------------------------------------------------

def _forward_fn(op: str, impl: str, size: Size, chunk: int,
                packed: Optional[bool] = None) -> Callable:
    """The forward of one (op, impl); packed None: f(*primals), else
    f(*primals, segment_ids) with segment_ids used only when packed."""
    s = size
    if packed is not None:
        if impl not in BACKENDS:
            raise ValueError(f"impl {impl!r} takes no segment_ids (public API impls only)")
        if op == "delta_rule":
            def fwd_ids(q, k, v, g, beta, ids):
                return gdn_kernels.gated_delta_rule(q, k, v, g, beta, chunk_size=chunk,
                                                    impl=impl,
                                                    segment_ids=ids if packed else None)
        elif op == "mixer":
            def fwd_ids(x, w, a, b, a_log, dt_bias, ids):
                return gdn_kernels.gdn_decoupled_conv1d(
                    x, w, a, b, a_log, dt_bias, chunk_size=chunk, impl=impl,
                    num_k_heads=s.Hk, num_v_heads=s.Hv, head_k_dim=s.Dk, head_v_dim=s.Dv,
                    segment_ids=ids if packed else None)
        else:
            raise ValueError(f"unknown op {op!r}")
        return fwd_ids
    if op == "delta_rule":
        if impl in BACKENDS:
            def fwd(q, k, v, g, beta):
                return gdn_kernels.gated_delta_rule(q, k, v, g, beta, chunk_size=chunk,
                                                    impl=impl)
        elif impl == "plain-chunked":
            def fwd(q, k, v, g, beta):
                o, s_final = chunked_gated_delta_rule(q, k, v, g, beta,
                                                      float(s.Dk ** -0.5), chunk)
                return o.astype(v.dtype), s_final
        elif impl == "xla-autodiff":
            def fwd(q, k, v, g, beta):
                acc = accumulation_dtype(v.dtype)
                s0 = jnp.zeros((s.B, s.Hv, s.Dk, s.Dv), acc)
                o, s_final, _ = xla_impl.forward(q, k, v, g, beta, s0,
                                                 float(s.Dk ** -0.5), chunk)
                return o.astype(v.dtype), s_final
        else:
            raise ValueError(f"unknown impl {impl!r}")
        return fwd
    if op == "mixer":
        heads = dict(num_k_heads=s.Hk, num_v_heads=s.Hv, head_k_dim=s.Dk,
                     head_v_dim=s.Dv)
        if impl in BACKENDS:
            def fwd(x, w, a, b, a_log, dt_bias):
                return gdn_kernels.gdn_decoupled_conv1d(x, w, a, b, a_log, dt_bias,
                                                        chunk_size=chunk, impl=impl,
                                                        **heads)
        elif impl in ("xla-autodiff", "plain-chunked"):
            cfg = mixer_mod.MixerConfig(impl="xla", num_k_heads=s.Hk, num_v_heads=s.Hv,
                                        head_k_dim=s.Dk, head_v_dim=s.Dv,
                                        use_qk_norm=True, eps=float(DEFAULT_EPS),
                                        scale=float(s.Dk ** -0.5), chunk_size=chunk)

            def fwd(x, w, a, b, a_log, dt_bias):
                pro = mixer_mod.prologue_of(cfg, x, w, a, b, a_log, dt_bias)
                if impl == "plain-chunked":
                    o, _ = chunked_gated_delta_rule(pro.q, pro.k, pro.v, pro.g, pro.beta,
                                                    cfg.scale, chunk)
                    return o.astype(x.dtype)
                s0 = jnp.zeros((s.B, s.Hv, s.Dk, s.Dv), pro.v.dtype)
                o, _, _ = xla_impl.forward(pro.q, pro.k, pro.v, pro.g, pro.beta, s0,
                                           cfg.scale, chunk)
                return o.astype(x.dtype)
        else:
            raise ValueError(f"unknown impl {impl!r}")
        return fwd
    raise ValueError(f"unknown op {op!r}")


def n_primals(op: str) -> int:
    return {"delta_rule": 5, "mixer": 6}[op]


def build_fn(op: str, impl: str, mode: str, size: Size, chunk: int,
             packed: Optional[bool] = None) -> Callable:
    """f(*primals, *cotangents): forward outputs (mode "fwd", cotangents
    ignored) or the gradients of sum(outputs * cotangents) w.r.t. every primal.
    packed True / False: f(*primals, *cotangents, segment_ids), the ids passed
    to the op / ignored (segment_ids=None); not differentiated."""
    n = n_primals(op)
    if packed is None:
        fwd = _forward_fn(op, impl, size, chunk)
        n_cots = None
    else:
        fwd = _forward_fn(op, impl, size, chunk, packed)
        n_cots = len(make_cotangent_shapes(op, size))

    def split(args):
        """(primals, cotangents, trailing args of the forward)."""
        if n_cots is None:
            return args[:n], args[n:], ()
        return args[:n], args[n:n + n_cots], args[n + n_cots:]

    if mode == "fwd":
        def f(*args):
            primals, _, extra = split(args)
            return fwd(*primals, *extra)
        return f
    if mode != "fwd+bwd":
        raise ValueError(f"unknown mode {mode!r}")

    def loss(*args):
        primals, cots, extra = split(args)
        outs = fwd(*primals, *extra)
        outs = outs if isinstance(outs, tuple) else (outs,)
        return sum(jnp.sum(o.astype(jnp.float32) * c) for o, c in zip(outs, cots))

    return jax.grad(loss, argnums=tuple(range(n)))


def make_cotangent_shapes(op: str, size: Size) -> List[Tuple[int, ...]]:
    """Shapes of the cotangents of make_inputs (one per output)."""
    s = size
    if op == "delta_rule":
        return [(s.B, s.T, s.Hv, s.Dv), (s.B, s.Hv, s.Dk, s.Dv)]
    if op == "mixer":
        return [(s.B, s.T, s.Hv, s.Dv)]
    raise ValueError(f"unknown op {op!r}")
