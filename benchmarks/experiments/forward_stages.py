"""Where the per-token time of xla_impl.forward grows with T: the three stages
(vmapped chunk_intra, the state scan, vmapped chunk_output), each jitted
alone, in us/token at T = 512, 2048, 8192 (B=2, Hk=2, Hv=4, D=128).
Run: python -m benchmarks.experiments.forward_stages"""
import statistics, time, os, jax, jax.numpy as jnp
from jax import lax
from gdn_kernels import chunk_math as cm, layout, xla_impl
from benchmarks import workloads as w
V = xla_impl._vmap_n
def stages(chunk, scale, t):
    def prep(q, k, v, g, beta):
        qc, kc, vc, gc, bc = xla_impl._chunked_inputs(q, k, v, g, beta, chunk, jnp.float32)
        return qc, kc, V(cm.chunk_intra, 3)(kc, vc, gc, bc)
    def scan(s0, kc, intra):
        def step(s, xs):
            nv, s1 = V(cm.chunk_state_step, 2)(s, xs[0], xs[1]); return s1, (s, nv)
        return lax.scan(step, s0, (kc, intra))
    def out(qc, kc, states, nv, dec):
        oc = V(cm.chunk_output, 3, in_axes=(0, 0, 0, 0, 0, None))(qc, kc, states, nv, dec, scale)
        return layout.from_chunks(oc, t)
    return jax.jit(prep), jax.jit(scan), jax.jit(out)
def med(f, a, n=5):
    jax.block_until_ready(f(*a)); ts = []
    for _ in range(n):
        jax.block_until_ready(f(*a)); t0 = time.perf_counter(); jax.block_until_ready(f(*a)); ts.append(time.perf_counter() - t0)
    return statistics.median(ts)
print("load", os.getloadavg()[0])
for T in (512, 2048, 8192):
    s = w.Size(2, T, 2, 4, 128, 128); q, k, v, g, b, co, cs = w.device_inputs("delta_rule", s, jnp.float32, 0)
    s0 = jnp.zeros((2, 4, 128, 128))
    p, sc, o = stages(64, 128 ** -0.5, T)
    qc, kc, intra = p(q, k, v, g, b); sf, (st, nv) = sc(s0, kc, intra)
    tp, ts, to = med(p, (q, k, v, g, b)), med(sc, (s0, kc, intra)), med(o, (qc, kc, st, nv, intra.dec))
    print(f"T={T:5d}  us/token: prep(intra) {tp/T*1e6:5.1f}  scan {ts/T*1e6:5.1f}  output {to/T*1e6:5.1f}  total {(tp+ts+to)/T*1e6:5.1f}")
print("load", os.getloadavg()[0])
