"""Experiment for the proposed xla_impl.forward change: run the chunked forward
over super-blocks of 512 tokens under an outer lax.scan (state carried), so
the vmapped per-chunk intermediates stay cache-sized. Prints us/token of the
current forward and the blocked one at B=2, Hk=2, Hv=4, D=128.
Run: python -m benchmarks.experiments.forward_superblocks
(measured 2-core CPU, load ~3: T=8192 52.6 -> 35.8 us/token; flat from T=2048)."""
import statistics, time, os, jax, jax.numpy as jnp
from jax import lax
from gdn_kernels import xla_impl
from benchmarks import workloads as w
def forward_blocked(q, k, v, g, beta, s0, scale, chunk, block):
    """xla_impl.forward over super-blocks of `block` tokens under an outer scan (state carried)."""
    b, t = q.shape[:2]; nb = t // block
    split = lambda x: jnp.moveaxis(x.reshape((b, nb, block) + x.shape[2:]), 1, 0)
    def step(s, xs):
        o, s1, res = xla_impl.forward(*xs, s, scale, chunk)
        return s1, (o, res)
    s_final, (o, res) = lax.scan(step, s0, tuple(split(x) for x in (q, k, v, g, beta)))
    return jnp.moveaxis(o, 0, 1).reshape((b, t) + o.shape[3:]), s_final, res
def med(f, a, n=3):
    jax.block_until_ready(f(*a)); ts = []
    for _ in range(n):
        jax.block_until_ready(f(*a)); t0 = time.perf_counter(); jax.block_until_ready(f(*a)); ts.append(time.perf_counter() - t0)
    return statistics.median(ts)
print("load", os.getloadavg()[0])
for T in (512, 2048, 8192):
    s = w.Size(2, T, 2, 4, 128, 128); q, k, v, g, b, co, cs = w.device_inputs("delta_rule", s, jnp.float32, 0)
    s0 = jnp.zeros((2, 4, 128, 128)); sc = 128 ** -0.5
    cur = jax.jit(lambda *a: xla_impl.forward(*a, s0, sc, 64)); new = jax.jit(lambda *a: forward_blocked(*a, s0, sc, 64, 512))
    oa, ob = cur(q, k, v, g, b)[0], new(q, k, v, g, b)[0]
    tc, tn = [], []
    for _ in range(2):
        tc.append(med(cur, (q, k, v, g, b))); tn.append(med(new, (q, k, v, g, b)))
    print(f"T={T:5d} us/token: current {min(tc)/T*1e6:5.1f}  blocks-of-512 {min(tn)/T*1e6:5.1f}   max|diff| {float(jnp.max(jnp.abs(oa-ob))):.1e}")
print("load", os.getloadavg()[0])
