"""Bad input: every generated contract violation raises the documented
exception type (ValueError, or TypeError for a non-floating dtype) whose
message names the offending argument, before any kernel runs."""

from __future__ import annotations

import dataclasses
import re
from typing import Callable, Dict

import numpy as np

from gdn_kernels import GDNState
from strategies import mixer_cases
from strategies.cases import MixerCase
from strategies.inputs import mixer_inputs

from ..targets.declaration import CONTRACT_CHUNK_SIZES
from ..engine.registry import prop
from ..engine.runners import mixer_static
from ..tolerance import structural_row
from .common import names_argument


@dataclasses.dataclass(frozen=True)
class Violation:
    """kind: what is broken; argument: the name the error must contain;
    error: the exception type expected."""
    kind: str
    argument: str
    error: type


def _mixer_call(target, inputs, **overrides):
    names = ("x", "conv_weight", "a", "b", "a_log", "dt_bias")
    args = [overrides.pop(n, inputs[n]) for n in names]
    return lambda: target.gdn_decoupled_conv1d(*args, **overrides)


def _delta_inputs(inputs, case):
    """q, k, v, g, beta, initial_state derived from the mixer inputs' shapes."""
    rng = np.random.default_rng(case.seed)
    b, t, hk, hv = case.batch, case.seq_len, case.k_heads, case.v_heads
    dt = inputs["x"].dtype
    return {"q": rng.standard_normal((b, t, hk, case.dk)).astype(dt),
            "k": rng.standard_normal((b, t, hk, case.dk)).astype(dt),
            "v": rng.standard_normal((b, t, hv, case.dv)).astype(dt),
            "g": -rng.uniform(0, 1, (b, t, hv)).astype(dt),
            "beta": rng.uniform(0, 1, (b, t, hv)).astype(dt),
            "initial_state": np.zeros((b, hv, case.dk, case.dv), np.float32)}


def _delta_call(target, inputs, **overrides):
    names = ("q", "k", "v", "g", "beta")
    args = [overrides.pop(n, inputs[n]) for n in names]
    overrides.setdefault("initial_state", inputs["initial_state"])
    return lambda: target.gated_delta_rule(*args, **overrides)


def _too_large_chunk(target) -> int:
    """Twice the largest chunk size the target accepts (256 for the
    contract's 16..128; 512 for a target declaring 256)."""
    return 2 * max(target.declaration.supports.chunk_sizes or CONTRACT_CHUNK_SIZES)


def violations(target, case: MixerCase) -> Dict[Violation, Callable]:
    """Every violation kind applied to the valid inputs of `case`."""
    m = mixer_inputs(case)
    kw = dict(mixer_static(case))
    d = _delta_inputs(m, case)
    b, t, hv = case.batch, case.seq_len, case.v_heads
    too_large = _too_large_chunk(target)
    x = m["x"]
    out = {
        Violation("x rank 2", "x", ValueError): _mixer_call(target, m, x=x[0], **kw),
        Violation("x channels off by one", "x", ValueError):
            _mixer_call(target, m, x=np.concatenate([x, x[..., :1]], -1), **kw),
        Violation("x integer dtype", "x", TypeError):
            _mixer_call(target, m, x=x.astype(np.int32), **kw),
        Violation("x float16", "x", ValueError): _mixer_call(target, m, x=x.astype(np.float16), **kw),
        Violation("T = 0", "x", ValueError):
            _mixer_call(target, m, x=x[:, :0], a=m["a"][:, :0], b=m["b"][:, :0], **kw),
        Violation("conv_weight channels", "conv_weight", ValueError):
            _mixer_call(target, m, conv_weight=m["conv_weight"][:, :-1], **kw),
        Violation("conv_weight rank 1", "conv_weight", ValueError):
            _mixer_call(target, m, conv_weight=m["conv_weight"][0], **kw),
        Violation("a wrong T", "a", ValueError):
            _mixer_call(target, m, a=np.zeros((b, t + 1, hv), x.dtype), **kw),
        Violation("b wrong heads", "b", ValueError):
            _mixer_call(target, m, b=np.zeros((b, t, hv + 1), x.dtype), **kw),
        Violation("a_log wrong heads", "a_log", ValueError):
            _mixer_call(target, m, a_log=np.zeros((hv + 1,), np.float32), **kw),
        Violation("a_log batch 3 != B", "a_log", ValueError):
            _mixer_call(target, m, a_log=np.zeros((b + 2, hv), np.float32), **kw),
        Violation("dt_bias rank 4", "dt_bias", ValueError):
            _mixer_call(target, m, dt_bias=np.zeros((1, 1, 1, hv), np.float32), **kw),
        Violation("dt_bias T' not in {1, T}", "dt_bias", ValueError):
            _mixer_call(target, m, dt_bias=np.zeros((1, t + 2, hv), np.float32), **kw),
        Violation("eps = 0", "eps", ValueError): _mixer_call(target, m, **(kw | {"eps": 0.0})),
        Violation("eps < 0", "eps", ValueError): _mixer_call(target, m, **(kw | {"eps": -1e-6})),
        Violation("chunk_size 48", "chunk_size", ValueError):
            _mixer_call(target, m, **(kw | {"chunk_size": 48})),
        Violation(f"chunk_size {too_large}", "chunk_size", ValueError):
            _mixer_call(target, m, **(kw | {"chunk_size": too_large})),
        Violation("chunk_size 8", "chunk_size", ValueError):
            _mixer_call(target, m, **(kw | {"chunk_size": 8})),
        Violation("Hv % Hk != 0", "num_v_heads", ValueError):
            _mixer_call(target, m, **(kw | {"num_k_heads": case.k_heads + case.v_heads})),
        Violation("q rank 3", "q", ValueError): _delta_call(target, d, q=d["q"][0], chunk_size=case.chunk),
        Violation("k shape != q", "k", ValueError):
            _delta_call(target, d, k=d["k"][:, :, :, :-1], chunk_size=case.chunk)
            if case.dk > 1 else _delta_call(target, d, k=d["k"][:1, :1], chunk_size=case.chunk),
        Violation("v batch", "v", ValueError):
            _delta_call(target, d, v=np.concatenate([d["v"], d["v"]], 0), chunk_size=case.chunk),
        Violation("Hv % Hk", "v", ValueError):
            _delta_call(target, d, v=np.zeros((b, t, case.k_heads * case.group + 1, case.dv), x.dtype),
                        g=np.zeros((b, t, case.k_heads * case.group + 1), x.dtype),
                        beta=np.zeros((b, t, case.k_heads * case.group + 1), x.dtype),
                        initial_state=None, chunk_size=case.chunk)
            if case.k_heads > 1 else _delta_call(target, d, q=np.repeat(d["q"], 2 * hv, 2)[:, :, :hv + 1],
                                                  k=np.repeat(d["k"], 2 * hv, 2)[:, :, :hv + 1],
                                                  initial_state=None, chunk_size=case.chunk),
        Violation("g shape", "g", ValueError): _delta_call(target, d, g=d["g"][:, :, :1] if hv > 1 else d["g"][:, :0], chunk_size=case.chunk),
        Violation("g positive", "g", ValueError): _delta_call(target, d, g=np.abs(d["g"]) + 0.5, chunk_size=case.chunk),
        Violation("beta integer", "beta", TypeError):
            _delta_call(target, d, beta=d["beta"].astype(np.int32), chunk_size=case.chunk),
        Violation("mixed activation dtypes", "v", ValueError):
            _delta_call(target, d, v=d["v"].astype(np.float64 if d["q"].dtype != np.float64 else np.float32), chunk_size=case.chunk),
        Violation("initial_state shape", "initial_state", ValueError):
            _delta_call(target, d, initial_state=np.zeros((b, hv, case.dv, case.dk + 1), np.float32), chunk_size=case.chunk),
        Violation("chunk_size not int", "chunk_size", ValueError):
            _delta_call(target, d, chunk_size=32.0),
        **_state_violations(target, case, m, kw),
    }
    return out


def _state_violations(target, case: MixerCase, m, kw) -> Dict[Violation, Callable]:
    """Carried-state violations (docs/contract.md section 7)."""
    b, hv, dk, dv = case.batch, case.v_heads, case.dk, case.dv
    conv = np.zeros((b, case.conv_width - 1, case.channels), m["x"].dtype)
    rec = np.zeros((b, hv, dk, dv), np.float32)
    rec_bad = (b, hv, dv, dk) if dk != dv else (b, hv, dk, dv + 1)
    return {
        Violation("state a dict", "state", TypeError):
            _mixer_call(target, m, state={"conv": conv, "recurrent": rec}, **kw),
        Violation("state.conv K off by one", "state.conv", ValueError):
            _mixer_call(target, m, state=GDNState(np.concatenate([conv, conv[:, :1]], 1), rec),
                        **kw),
        Violation("state.conv integer", "state.conv", TypeError):
            _mixer_call(target, m, state=GDNState(conv.astype(np.int32), rec), **kw),
        Violation("state.recurrent Dk, Dv swapped", "state.recurrent", ValueError):
            _mixer_call(target, m, state=GDNState(conv, np.zeros(rec_bad, np.float32)), **kw),
        Violation("state.recurrent batch", "state.recurrent", ValueError):
            _mixer_call(target, m, state=GDNState(conv, np.concatenate([rec, rec], 0)), **kw),
        Violation("return_state not a bool", "return_state", ValueError):
            _mixer_call(target, m, return_state="yes", **kw),
    }


@prop("bad_input_raises_named_error", family="bad_input", strategy=mixer_cases(near_zero=False),
      weight=4, wrong_target="verification.fixture_kernels.wrong_targets.unvalidated", needs=("validates_input",),
      covers={"Hk=2": lambda c: c.k_heads == 2, "dk=8": lambda c: c.dk == 8},
      on_sharded_target=True)
def bad_input_raises_named_error(target, case: MixerCase):
    """Every generated contract violation raises the documented exception
    type (ValueError, or TypeError for a non-floating dtype) whose message
    names the offending argument; nothing else escapes."""
    rows = []
    for violation, call in violations(target, case).items():
        try:
            call()
            ok, note = False, "no error raised"
        except violation.error as err:
            ok = names_argument(str(err), violation.argument)
            note = f"message does not name {violation.argument!r}: {err}"
        except Exception as err:  # noqa: BLE001 - the finding is the wrong type
            ok, note = False, f"{type(err).__name__} instead of {violation.error.__name__}: {err}"
        rows.append(structural_row(violation.kind, ok, note[:120]))
    return rows
