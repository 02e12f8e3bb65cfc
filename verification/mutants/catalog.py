"""The seeded bugs. Each models a real-world mistake in one line of source,
names the file it patches (relative to gdn_kernels/), the property expected
to kill it, and the impls whose code path it breaks (chunk_math is shared by
the XLA twin and the Pallas kernels, so its mutants break both)."""

from __future__ import annotations

import dataclasses
from typing import Dict, Tuple, Union

from gdn_kernels.backends import CHUNKED


@dataclasses.dataclass(frozen=True)
class Mutant:
    """One seeded bug: `old` replaced by `new` inside `function` (its
    qualified name, e.g. "chunk_state_step" or "_sharded_mixer.run"; a
    tuple for a site in several functions) of gdn_kernels/`file`."""
    name: str
    description: str
    file: str
    old: str
    new: str
    killers: Tuple[str, ...]      # properties expected to kill it
    impls: Tuple[str, ...] = CHUNKED   # the impls whose code path it breaks
    count: int = 1                # occurrences of `old` that are replaced
    function: Union[str, Tuple[str, ...]] = ""

    @property
    def functions(self) -> Tuple[str, ...]:
        return (self.function,) if isinstance(self.function, str) else tuple(self.function)


_ALL = [
    Mutant("l2norm_bwd_eps_1e12",
           "QK L2-norm backward uses eps 1e-12 while the forward uses 1e-6",
           "mixer.py",
           "l2norm.l2norm_backward(pro.q_raw, dq, cfg.eps)",
           "l2norm.l2norm_backward(pro.q_raw, dq, 1e-12)",
           ("near_zero_rows_vjp_parity", "vjp_matches_finite_differences"),
           function="_bwd"),
    Mutant("param_grad_axis_01",
           "a_log/dt_bias gradient reduced over axis=(0, 1) whatever the parameter's rank",
           "gates.py",
           "    reduced = jnp.sum(ct, axis=axes, keepdims=True) if axes else ct\n"
           "    return reduced.reshape(param_shape)",
           "    return jnp.sum(ct, axis=(0, 1))",
           ("cotangent_shapes_and_dtypes", "mixer_gradient_parity"),
           function="reduce_to_param_shape"),
    Mutant("tail_padded_with_edge_tokens",
           "tail chunk padded by repeating the last token instead of identity steps "
           "when T is not a multiple of C",
           "layout.py",
           "    return jnp.pad(x, widths)",
           "    return jnp.pad(x, widths, mode=\"edge\")",
           ("delta_rule_forward_parity", "split_invariance"),
           function="pad_time"),
    Mutant("no_decay_between_chunks",
           "decay exp(Gam_C) not applied to the state carried into the next chunk",
           "chunk_math.py",
           "    s1 = intra.dec.total * s0 + _dot_tn(k * intra.dec.tail, new_values)",
           "    s1 = s0 + _dot_tn(k * intra.dec.tail, new_values)",
           ("delta_rule_forward_parity", "mixer_forward_parity"),
           function="chunk_state_step"),
    Mutant("bwd_cumsum_wrong_direction",
           "within-chunk cumulative decay summed forward instead of in reverse in the backward",
           "chunk_math.py",
           "    return _dot((row <= col).astype(x.dtype), x)",
           "    return _dot((row >= col).astype(x.dtype), x)",
           ("delta_rule_gradient_parity", "mixer_gradient_parity"),
           function="_reverse_cumsum"),
    Mutant("mask_after_exp",
           "decay exponent masked after exp instead of before (inf * 0 = NaN above the diagonal)",
           "chunk_math.py",
           "    diff = jnp.where(lower, (hi_col - hi_row) + (lo_col - lo_row), 0.0)  # mask BEFORE exp\n"
           "    decay = jnp.where(lower, jnp.exp(diff), 0.0)",
           "    diff = (hi_col - hi_row) + (lo_col - lo_row)\n"
           "    decay = jnp.exp(diff) * lower.astype(diff.dtype)",
           ("delta_rule_forward_parity", "mixer_forward_parity"),
           # Equivalent mutant on the Pallas path under XLA:CPU: inside the
           # interpreted kernel XLA rewrites exp(x) * convert(mask) into a
           # select, so no NaN appears and no output differs by a single bit
           # (checked in hlo and tpu-sim modes; it survived the whole suite).
           # It stays a live mutant of the XLA path, where the NaN shows.
           impls=("xla",),
           function="chunk_decay"),
    Mutant("inverse_offdiag_block_sign",
           "off-diagonal block of the blocked triangular inverse computed with the wrong sign",
           "chunk_math.py",
           "    t21 = -_dot(t22, _dot(a[h:, :h], t11))",
           "    t21 = _dot(t22, _dot(a[h:, :h], t11))",
           ("delta_rule_forward_parity", "chunk_size_invariance"),
           function="invert_unit_lower"),
    Mutant("inverse_by_squared_neumann_series",
           "the chunk's (I + A)^-1 computed as the squared Neumann series "
           "(I - A)(I + A^2)(I + A^4)...: exact in exact arithmetic, its terms grow "
           "binomially and cancel in float32 when a chunk's keys share a direction",
           "chunk_math.py",
           "    n = a.shape[0]\n"
           "    if n <= INVERSE_BLOCK:\n"
           "        return _invert_by_doubling(a)\n",
           "    n = a.shape[0]\n"
           "    t, p = jnp.eye(n, dtype=a.dtype) - a, _dot(a, a)\n"
           "    for _ in range(max(1, (n - 1).bit_length())):\n"
           "        t, p = t + _dot(t, p), _dot(p, p)\n"
           "    return t\n",
           ("delta_rule_forward_parity", "mixer_forward_parity"),
           function="invert_unit_lower"),
    Mutant("inverse_by_power_series_64",
           "the chunk's (I + A)^-1 computed as the power series I - A + A^2 - ... "
           "truncated after A^63: exact for chunks of up to 64 rows (A is nilpotent), "
           "wrong at chunk 128, where field kernels default",
           "chunk_math.py",
           "    n = a.shape[0]\n"
           "    if n <= INVERSE_BLOCK:\n"
           "        return _invert_by_doubling(a)\n",
           "    n = a.shape[0]\n"
           "    eye = jnp.eye(n, dtype=a.dtype)\n"
           "    t = eye\n"
           "    for _ in range(min(n, 64) - 1):\n"
           "        t = eye - _dot(a, t)\n"
           "    return t\n",
           ("delta_rule_forward_parity", "mixer_forward_parity"),
           function="invert_unit_lower"),
    Mutant("decay_cumsum_in_bfloat16",
           "the chunk's cumulative log decay kept in bfloat16 (rounded after the sum): "
           "every exp(Gam_i - Gam_j) off by up to 2^-9 |Gam|, growing along the chunk",
           "chunk_math.py",
           "        column = _dot(tri, part)                                       # [C, 1]\n",
           "        column = _dot(tri, part).astype(jnp.bfloat16).astype(part.dtype)\n",
           ("delta_rule_forward_parity", "mixer_forward_parity"),
           function="chunk_decay.cumulative"),
    Mutant("gva_dq_dk_not_summed",
           "dq/dk of a key head taken from its first value head instead of summed over the G heads",
           "xla_impl.py",
           "    dq = layout.sum_head_groups(xla_layout.block_to_rows(grads.dq), group)\n"
           "    dk = layout.sum_head_groups(xla_layout.block_to_rows(grads.dk), group)",
           "    dq = xla_layout.block_to_rows(grads.dq)[:, :, ::group]\n"
           "    dk = xla_layout.block_to_rows(grads.dk)[:, :, ::group]",
           ("delta_rule_gradient_parity", "gva_equals_explicit_repeat"), impls=("xla",),
           function="grads_to_rows"),
    Mutant("conv_bwd_shift_by_one",
           "Conv1D backward shifted by one tap",
           "conv1d.py",
           "        dext = dext + weight[j] * dpre_j",
           "        dext = dext + weight[j] * _placed(_tap(dpre, valid, j)[:, 1:], j, width + 1)",
           ("mixer_gradient_parity",),
           function="_block_backward"),
    Mutant("state_in_bf16",
           "recurrent state accumulated in bfloat16 (rounded at every chunk boundary)",
           "chunk_math.py",
           "    s1 = intra.dec.total * s0 + _dot_tn(k * intra.dec.tail, new_values)\n",
           "    s1 = intra.dec.total * s0 + _dot_tn(k * intra.dec.tail, new_values)\n"
           "    s1 = s1.astype(jnp.bfloat16).astype(s0.dtype)\n",
           ("delta_rule_forward_parity", "mixer_forward_parity"),
           function="chunk_state_step"),
    Mutant("dinitial_state_dropped",
           "cotangent of initial_state dropped (zeros returned)",
           "xla_impl.py",
           "    return dq, dk, dv, dg, dbeta, ds_initial",
           "    return dq, dk, dv, dg, dbeta, jax.numpy.zeros_like(ds_initial)",
           ("delta_rule_gradient_parity",), impls=("xla",),
           function="backward"),
    Mutant("beta_applied_twice",
           "beta applied twice to the values in the WY factor u = Tinv (beta v)",
           "chunk_math.py",
           "    u = _dot(tinv, v * beta)",
           "    u = _dot(tinv, v * beta * beta)",
           ("delta_rule_forward_parity", "mixer_forward_parity"),
           function="chunk_wy_factors"),
    Mutant("gate_bwd_sigmoid_sign",
           "gate backward uses sigmoid(-z) for d softplus(z)/dz",
           "gates.py",
           "    da = dg * (-decay_rate * jax.nn.sigmoid(z))",
           "    da = dg * (-decay_rate * jax.nn.sigmoid(-z))",
           ("mixer_gradient_parity",),
           function="gate_backward"),
    Mutant("tail_cotangent_dropped",
           "backward drops the cotangent of the within-chunk tail decay exp(Gam_C - Gam_j)",
           "chunk_math.py",
           "    dg = _reverse_cumsum(dgam) + dg_tail + _straddling_pair_sums(z_p + z_a)",
           "    dg = _reverse_cumsum(dgam) + _straddling_pair_sums(z_p + z_a)",
           ("delta_rule_gradient_parity",),
           function="chunk_backward"),
]

_ALL += [
    Mutant("conv_forward_looks_ahead",
           "causal conv reads future tokens (taps shifted left instead of right)",
           "conv1d.py",
           "        pre = pre + weight[j] * _tap(ext[:, j:j + t], valid, j)",
           "        pre = pre + weight[j] * _tap(_placed(ext, 0, 2 * width - 1)"
           "[:, j + width - 1:j + width - 1 + t], valid, j)",
           ("causality", "mixer_forward_parity"),
           function="_preactivation"),
    Mutant("gva_tile_not_repeat",
           "key heads expanded with tile (h % Hk) instead of repeat (h // G)",
           "layout.py",
           "    return x if group == 1 else jnp.repeat(x, group, axis=axis)",
           "    return x if group == 1 else jnp.tile(x, tuple(group if i == axis else 1 "
           "for i in range(x.ndim)))",
           ("gva_equals_explicit_repeat", "delta_rule_forward_parity"), impls=("xla",),
           function="repeat_heads"),
    Mutant("initial_state_ignored",
           "initial_state ignored by the chunked forward (zeros used)",
           "xla_impl.py",
           "    s0 = varying_like(s0.astype(x.acc), q, k, v, g, beta)",
           "    s0 = varying_like(jax.numpy.zeros_like(s0, x.acc), q, k, v, g, beta)",
           ("split_invariance", "delta_rule_forward_parity"), impls=("xla",),
           function="forward"),
    Mutant("l2norm_bwd_hardcoded_eps",
           "L2-norm backward hard-codes eps = 1e-6 instead of using its eps argument",
           "l2norm.py",
           "    r = lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)\n    return r * dy",
           "    r = lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + 1e-6)\n    return r * dy",
           ("l2norm_scale_invariance", "near_zero_rows_vjp_parity"),
           function="l2norm_backward"),
    Mutant("l2norm_sums_over_batch",
           "L2 norm computed over the batch axis too (batch rows mixed)",
           "l2norm.py",
           "jnp.sum(x * x, axis=-1, keepdims=True)",
           "jnp.sum(x * x, axis=(0, -1), keepdims=True)",
           ("batch_independence", "mixer_forward_parity"), count=2,
           function=("l2norm_forward", "l2norm_backward")),
]

# The Pallas twins of path-specific bugs, and bugs only the kernels can have.
_ALL += [
    Mutant("pallas_gva_dq_dk_not_summed",
           "Pallas: dq/dk of a key head taken from its first value head, not summed over G",
           "pallas_impl.py",
           "    dq_ref[...] = _rows_to_heads(layout.sum_head_groups(grads.dq, d.group, axis=0), d.kb)\n"
           "    dk_ref[...] = _rows_to_heads(layout.sum_head_groups(grads.dk, d.group, axis=0), d.kb)",
           "    dq_ref[...] = _rows_to_heads(grads.dq[::d.group], d.kb)\n"
           "    dk_ref[...] = _rows_to_heads(grads.dk[::d.group], d.kb)",
           ("delta_rule_gradient_parity", "gva_equals_explicit_repeat"), impls=("pallas",),
           function="_backward_kernel"),
    Mutant("pallas_dinitial_state_dropped",
           "Pallas: cotangent of initial_state dropped (zeros returned)",
           "pallas_impl.py",
           "            _token_output(dv_, t, d.hv), dg, dbeta, ds0)",
           "            _token_output(dv_, t, d.hv), dg, dbeta, jnp.zeros_like(ds0))",
           ("delta_rule_gradient_parity",), impls=("pallas",),
           function="backward"),
    Mutant("pallas_gva_head_mapping",
           "Pallas: value row r of a step reads key row r % (P / G) instead of r // G",
           "pallas_impl.py",
           "    q, k = (layout.repeat_heads(x, d.group, axis=0) for x in (q, k))",
           "    q, k = (jnp.tile(x, (d.group, 1, 1)) for x in (q, k))",
           ("gva_equals_explicit_repeat", "delta_rule_forward_parity"), impls=("pallas",),
           function="_step_tokens"),
    Mutant("pallas_state_not_initialised",
           "Pallas: state scratch zeroed instead of loaded from initial_state",
           "pallas_impl.py",
           "        pltpu.sync_copy(_state_block(s0_hbm, i, j, d), s_scr)",
           "        s_scr[...] = jnp.zeros_like(s_scr)",
           ("split_invariance", "delta_rule_forward_parity"), impls=("pallas",),
           function="_forward_kernel._init"),
    Mutant("pallas_bwd_reads_chunks_forward",
           "Pallas backward streams chunks in forward order while walking them in reverse",
           "pallas_impl.py",
           "    slot = _stream_chunks(streams, sems, n, n_chunks, lambda c: n_chunks - 1 - c,",
           "    slot = _stream_chunks(streams, sems, n, n_chunks, lambda c: c,",
           ("delta_rule_gradient_parity", "mixer_gradient_parity"), impls=("pallas",),
           function="_backward_kernel"),
]

# Packed sequences and padding (docs/contract.md section 6). Bugs in the
# plain-JAX code both impls share outside the kernels (segments.py, the
# custom_vjp wrappers) run on xla only: the pallas run would execute the same
# broken lines; bugs in the chunk math and the kernel layout run on both.
_ALL += [
    Mutant("segment_state_not_reset",
           "documents never split: the recurrent state and conv window run on "
           "from one packed document into the next",
           "segments.py",
           "    doc = jnp.cumsum(start.astype(jnp.int32), axis=1)",
           "    doc = jnp.zeros_like(ids)",
           ("packed_equals_separate", "packed_gradient_parity"), impls=("xla",),
           function="from_ids"),
    Mutant("reset_only_at_chunk_edges",
           "the state is reset between chunks but not at a document start inside a chunk",
           "chunk_math.py",
           "        lower = lower & same\n",
           "        lower = lower\n",
           ("packed_equals_separate", "packed_gradient_parity"),
           function="chunk_decay"),
    Mutant("conv_window_crosses_documents",
           "the conv window reads the previous document's last tokens",
           "segments.py",
           "    valid = [(_delayed(doc_x, width - 1 - j, -2) == doc_x) & (doc_x >= 0)",
           "    valid = [(_delayed(doc_x, width - 1 - j, -2) >= 0) & (doc_x >= 0)",
           ("mixer_packed_equals_separate", "mixer_packed_gradient_parity"), impls=("xla",),
           function="conv_windows"),
    Mutant("conv_ignores_padding",
           "the conv runs over the padded row (not compacted): padding smeared into the "
           "next tokens",
           "mixer.py",
           "    row = x if seg is None else segments.to_compact(x, win, seg.pad)\n",
           "    row = x\n",
           ("padding_transparency", "mixer_packed_gradient_parity"), impls=("xla",),
           function="_extended_input"),
    Mutant("padding_cotangents_not_zeroed",
           "the backward leaves the decay-gate cotangent of padding tokens non-zero",
           "delta_rule.py",
           "    grads = zero_padding_all(seg, *grads)\n",
           "    grads = tuple(grads)\n",
           ("packed_gradient_parity", "packed_equals_separate"), impls=("xla",),
           function="_bwd"),
    Mutant("doc_tail_padded_with_zeros",
           "the tail chunk's document numbers padded with 0: the last document's "
           "writes are cut from the final state when T is not a multiple of C",
           "layout.py",
           "        doc = doc.at[:, t:].set(seg.doc[:, t - 1:t])\n",
           "        doc = doc\n",
           ("packed_gradient_parity", "packed_equals_separate"),
           function="segment_scalars"),
    Mutant("padding_id_off_by_one",
           "id 1 read as padding (padding tested as ids <= 1)",
           "segments.py",
           "    real = ids > 0\n",
           "    real = ids > 1\n",
           ("segment_ids_are_data", "packed_gradient_parity"), impls=("xla",),
           function="from_ids"),
    # carried state and decode (docs/contract.md section 7): the hand-off bugs
    Mutant("conv_state_from_outputs",
           "the returned conv state holds the conv's outputs (silu) instead of its inputs",
           "mixer.py",
           "    conv = conv_state(ext, conv_weight.shape[0] - 1, seg, win).astype(x.dtype)",
           "    conv = conv_state(_extended_input(jax.nn.silu(pro.pre), s_in.conv, seg, win),"
           " conv_weight.shape[0] - 1, seg, win).astype(x.dtype)",
           ("mixer_split_invariance", "state_gradient_parity"),
           function="_forward"),
    Mutant("short_prompt_history_dropped",
           "a call shorter than K-1 tokens returns a conv state of its own inputs "
           "zero-padded, dropping the older history",
           "mixer.py",
           "        return ext[:, ext.shape[1] - history:]",
           "        return jnp.pad(ext[:, history:], ((0, 0), (history, 0), (0, 0)))"
           "[:, ext.shape[1] - history:]",
           ("prompt_then_decode", "mixer_split_invariance"),
           function="conv_state"),
    # one per edge class of a split the state family claims (mixer_split_invariance's
    # SPLIT_COVERS): each is met by a claim case in every run, the dev loop's included
    Mutant("one_token_call_conv_state_not_shifted",
           "T1=1: a one-token call returns the conv history it was handed, its token "
           "not shifted in",
           "mixer.py",
           "        return ext[:, ext.shape[1] - history:]",
           "        return ext[:, :history] if ext.shape[1] == history + 1 else "
           "ext[:, ext.shape[1] - history:]",
           ("mixer_split_invariance",),
           function="conv_state"),
    Mutant("short_call_history_dropped",
           "1<T<K-1 after a non-zero history: a call of 2..K-2 tokens returns a conv state "
           "of its own inputs zero-padded, dropping the history it was handed",
           "mixer.py",
           "        return ext[:, ext.shape[1] - history:]",
           "        row = ext.shape[1] - history\n"
           "        kept = jnp.pad(ext[:, history:], ((0, 0), (history, 0), (0, 0))) "
           "if 1 < row < history else ext\n"
           "        return kept[:, ext.shape[1] - history:]",
           ("mixer_split_invariance",),
           function="conv_state"),
    Mutant("chunk_edge_state_decayed_twice",
           "T1=C: a call ending on a chunk edge (no tail padding) applies its last token's "
           "decay to the returned recurrent state a second time",
           "mixer.py",
           "    (o,) = zero_padding_all(seg, o.astype(x.dtype))\n"
           "    conv = conv_state(",
           "    if x.shape[1] % cfg.chunk_size == 0:\n"
           "        s_final = s_final * jnp.exp(pro.g[:, -1])[..., None, None]\n"
           "    (o,) = zero_padding_all(seg, o.astype(x.dtype))\n"
           "    conv = conv_state(",
           ("mixer_split_invariance",),
           function="_forward"),
    Mutant("one_token_call_state_gradient_dropped",
           "T2=1: a one-token call returns a zero cotangent for the recurrent state it was "
           "handed (the long call before it gets no gradient through the hand-off)",
           "mixer.py",
           "ds0.astype(state.recurrent.dtype))",
           "(ds0 if x.shape[1] > 1 else jnp.zeros_like(ds0)).astype(state.recurrent.dtype))",
           ("mixer_split_invariance",),
           function="_bwd"),
    Mutant("decode_eps_mismatch",
           "decode-length calls (T <= 4) normalise q/k with eps 1e-12 instead of the call's eps",
           "mixer.py",
           "        q, k = l2norm.l2norm_forward(q_raw, cfg.eps), l2norm.l2norm_forward(k_raw, cfg.eps)",
           "        eps = cfg.eps if q_raw.shape[1] > 4 else 1e-12\n"
           "        q, k = l2norm.l2norm_forward(q_raw, eps), l2norm.l2norm_forward(k_raw, eps)",
           ("prompt_then_decode",),
           function="prologue"),
    Mutant("decode_without_decay",
           "the decode step writes and reads the state without decaying it by exp(g)",
           "recurrent_impl.py",
           "    decay = jnp.exp(g_t)[..., None]",
           "    decay = jnp.ones_like(g_t)[..., None]",
           ("prompt_then_decode", "mixer_split_invariance"),
           function="delta_step"),
    Mutant("state_downcast_between_calls",
           "the returned recurrent state is rounded to bfloat16 between calls",
           "mixer.py",
           "    return (o, GDNState(conv, s_final)), (ext, win, pro._replace(pre=None), res)",
           "    return (o, GDNState(conv, s_final.astype(jnp.bfloat16).astype(s_final.dtype))), "
           "(ext, win, pro._replace(pre=None), res)",
           ("prompt_then_decode", "decode_drift"),
           function="_forward"),
    Mutant("incoming_state_gradient_dropped",
           "the backward returns a zero cotangent for the incoming recurrent state",
           "mixer.py",
           "ds0.astype(state.recurrent.dtype))",
           "jnp.zeros_like(state.recurrent))",
           ("state_gradient_parity", "mixer_split_invariance"),
           function="_bwd"),
    # sharding over a mesh (docs/contract.md section 8)
    Mutant("sharded_value_heads_by_key_index",
           "a head shard takes its value-head channels from the key-head index "
           "(heads split without their group): every shard but the first reads "
           "other groups' values when G > 1",
           "sharded.py",
           "                   np.arange(v0 + j * hv * dv, v0 + (j + 1) * hv * dv)]",
           "                   np.arange(v0 + j * hk * dv, v0 + j * hk * dv + hv * dv)]",
           ("sharded_mixer_equals_one_device",), impls=("xla",),
           function="channel_order"),
    Mutant("sharded_parameter_gradient_not_reduced",
           "a parameter shared by the batch shards gets the first shard's partial "
           "gradient only (the other shards' parts are never summed in)",
           "sharded.py",
           "        return (jax.lax.psum(dp, axis),)",
           "        return (jax.lax.psum(jax.numpy.where(jax.lax.axis_index(axis) == 0, dp, 0), axis),)",
           ("sharded_mixer_equals_one_device",), impls=("xla",),
           function="_shared_by_batch_shards.bwd"),
    Mutant("sharded_parameter_gradient_reduced_twice",
           "a parameter shared by the batch shards has its gradient summed over the "
           "batch axis twice",
           "sharded.py",
           "        return (jax.lax.psum(dp, axis),)",
           "        return (jax.lax.psum(jax.lax.psum(dp, axis), axis),)",
           ("sharded_mixer_equals_one_device",), impls=("xla",),
           function="_shared_by_batch_shards.bwd"),
    Mutant("sharded_initial_state_ignored",
           "the sharded core op starts every shard from zeros, ignoring the caller's "
           "initial state",
           "sharded.py",
           "        return fn(q, k, v, g, beta, initial_state, segment_ids)",
           "        return fn(q, k, v, g, beta, api.zero_initial_state(q, v), segment_ids)",
           ("sharded_delta_rule_equals_one_device",), impls=("xla",),
           function="ShardedOps.gated_delta_rule"),
    Mutant("sharded_divisibility_unchecked",
           "the sharded ops skip the divisibility check: an indivisible batch or head "
           "count fails inside jax.shard_map without naming the argument",
           "sharded.py",
           "        if size % shards:\n",
           "        if False:\n",
           ("sharded_bad_input_raises_named_error",), impls=("xla",),
           function="ShardedOps._check_divides"),
    Mutant("sharded_conv_state_replicated",
           "the returned conv state is gathered onto every device (replicated) "
           "instead of staying split by the batch axis",
           "sharded.py",
           "        conv = permute(new_state.conv, inverse, rows, rows)",
           "        conv = permute(new_state.conv, inverse, rows, P())",
           ("sharded_code_communicates_only_as_allowed",), impls=("xla",),
           function="_sharded_mixer.run"),
    Mutant("sharded_gradient_over_unused_axis",
           "a shared parameter's gradient, once summed over the batch axis, is also "
           "averaged over the head axis: right values on a batch-only mesh, but an "
           "all-reduce along an axis that splits nothing",
           "sharded.py",
           "        return (jax.lax.psum(dp, axis),)",
           "        return (jax.lax.pmean(jax.lax.psum(dp, axis), (axis, \"model\")),)",
           ("sharded_code_communicates_only_as_allowed",), impls=("xla",),
           function="_shared_by_batch_shards.bwd"),
]

MUTANTS: Dict[str, Mutant] = {m.name: m for m in _ALL}
